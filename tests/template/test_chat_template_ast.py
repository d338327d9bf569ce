"""Template analysis: free variables and vLLM's content-format detection."""

from __future__ import annotations

import pytest

from tokenkeys.template.render import ChatTemplateRenderer


def fmt(template: str) -> str:
    return ChatTemplateRenderer(template).content_format


@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}",
        "{% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}",
        # aliases through set, slices, filters and tests (vLLM follows all of them)
        "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}"
        "{% for c in m['content'] | selectattr('type', 'equalto', 'text') %}{% endfor %}"
        "{% endfor %}",
        "{% set a = messages %}{% set b = a|list %}{% for m in b|reverse %}"
        "{% for c in m.content[1:] %}{% endfor %}{% endfor %}",
    ],
)
def test_openai_format(template: str) -> None:
    assert fmt(template) == "openai"


@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% endif %}{% endfor %}",
        # a loop over content of something that is not a message
        "{% for c in documents[0]['content'] %}{% endfor %}",
        # a tuple loop target: vLLM's detection asserts on it and falls back to "string"
        "{% for m in messages %}{% for a, b in m.content %}{% endfor %}{% endfor %}",
        "{% for a, b in messages|batch(2) %}{% endfor %}",
    ],
)
def test_string_format(template: str) -> None:
    assert fmt(template) == "string"


def test_alias_cycles_terminate() -> None:
    template = "{% set a = messages %}{% set b = a %}{% set a = b %}{% for m in a %}"
    template += "{% for c in m.content %}{% endfor %}{% endfor %}"
    assert fmt(template) == "openai"


def test_free_variables() -> None:
    renderer = ChatTemplateRenderer(
        "{% set x = 1 %}{% for m in messages %}{{ bos_token }}{{ x }}{% endfor %}"
        "{% if enable_thinking %}{{ strftime_now('%Y') }}{% endif %}"
    )
    # transformers' globals count as free variables, as in vLLM; jinja's own do not.
    assert renderer.variables == {"messages", "bos_token", "enable_thinking", "strftime_now"}
    assert "range" not in ChatTemplateRenderer("{{ range(3)|list }}").variables
