"""The chat template environment: transformers' features, the sandbox, and render limits."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.errors import InvalidArgument, LimitExceeded
from tokenkeys.template.render import ChatTemplateRenderer, RenderLimits

USER = [{"role": "user", "content": "hi"}]


def render(template: str, limits: RenderLimits | None = None, **variables) -> str:
    return ChatTemplateRenderer(template, limits=limits).render(USER, variables=variables)


# --- transformers features ---


def test_trim_and_lstrip_blocks() -> None:
    template = "A\n    {% if true %}\n    B\n    {% endif %}\nC"
    assert render(template) == "A\n    B\nC"


def test_loop_controls() -> None:
    template = "{% for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}"
    template += "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    assert render(template) == "023"


def test_generation_block_renders_its_body() -> None:
    template = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}"
    template += "{% endfor %}"
    assert render(template) == "[hi]"


def test_tojson_does_not_escape_html_nor_ascii_and_keeps_order() -> None:
    value = {"z": "<b>&'</b>", "a": "日本 é 🎉"}
    assert render("{{ v|tojson }}", v=value) == json.dumps(value, ensure_ascii=False)


def test_tojson_arguments_in_transformers_order() -> None:
    value = {"b": [1, 2], "a": "é"}
    assert render("{{ v|tojson(indent=2) }}", v=value) == json.dumps(
        value, ensure_ascii=False, indent=2
    )
    assert render("{{ v|tojson(sort_keys=true) }}", v=value) == '{"a": "é", "b": [1, 2]}'
    assert render("{{ v|tojson(separators=(',', ':')) }}", v=value) == '{"b":[1,2],"a":"é"}'
    # The first positional argument is ensure_ascii, as in transformers.
    assert render("{{ v|tojson(true) }}", v=value) == '{"b": [1, 2], "a": "\\u00e9"}'


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_tojson_round_trips(value) -> None:
    assert json.loads(render("{{ v|tojson }}", v=value)) == value


def test_strftime_now_uses_the_injected_clock() -> None:
    renderer = ChatTemplateRenderer(
        "{{ strftime_now('%Y-%m-%d %d %B') }}", clock=lambda: datetime(2024, 2, 29, 13, 5)
    )
    assert renderer.render(USER) == "2024-02-29 29 February"


def test_raise_exception_carries_the_template_message() -> None:
    with pytest.raises(InvalidArgument) as info:
        render("{{ raise_exception('Conversation roles must alternate user/assistant') }}")
    assert info.value.field == "chat_template"
    assert info.value.message == (
        "chat_template raised an error: Conversation roles must alternate user/assistant"
    )
    assert info.value.details["template_message"] == (
        "Conversation roles must alternate user/assistant"
    )


def test_dict_and_namespace_globals() -> None:
    template = "{% set d = dict(a=1, b=2) %}{{ d|tojson }} {{ dict.fromkeys(['x'], 0)|tojson }}"
    template += "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    template += "{% endfor %} {{ ns.n }}"
    assert render(template) == '{"a": 1, "b": 2} {"x": 0} 1'


# --- the sandbox ---

ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ().__class__.__base__.__subclasses__() }}",
    "{{ ''.__class__ }}",
    "{{ messages.__class__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ strftime_now.__globals__['datetime'] }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ lipsum.__globals__['os'] }}",
    "{{ self.__init__.__globals__ }}",
    "{{ dict.__class__ }}",
    "{{ ''|attr('__class__') }}",
    "{{ '{0.__class__.__mro__}'.format('') }}",
    "{{ '%s'.__mod__ }}",
    "{% set l = [] %}{{ l.append(1) }}",
    "{% set d = {} %}{{ d.update({'a': 1}) }}",
    "{{ messages.pop() }}",
    "{% set ns = namespace(_secret=1) %}{{ ns }}",
    "{% set ns = namespace() %}{% set ns.__dict__ = 1 %}",
]


@pytest.mark.parametrize("template", ESCAPES)
def test_escapes_are_refused(template: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        render(template)
    assert info.value.field == "chat_template"


def test_inputs_are_not_mutated_by_a_template() -> None:
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidArgument):
        ChatTemplateRenderer("{{ messages[0].update({'role': 'x'}) }}").render(messages)
    assert messages == [{"role": "user", "content": "hi"}]


# --- limits ---


def test_megabyte_outputs_are_bounded() -> None:
    limits = RenderLimits(max_output_chars=1 << 20)
    template = "{% for i in range(5000) %}{{ 'x' * 1000 }}{% endfor %}"
    with pytest.raises(LimitExceeded, match="1048576-character"):
        render(template, limits)
    assert len(render(template, RenderLimits(max_output_chars=5_000_000))) == 5_000_000


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'a' * 10**9 }}",
        "{{ [0] * 10**9 }}",
        "{{ 10**9 * 'a' }}",
        "{{ 2 ** 100000000 }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    ],
)
def test_builders_of_huge_values_are_refused(template: str) -> None:
    with pytest.raises(LimitExceeded):
        render(template)


def test_render_time_limit_with_a_fake_clock() -> None:
    ticks = iter(range(10**9))
    limits = RenderLimits(max_render_seconds=5.0, monotonic=lambda: float(next(ticks)))
    looping = "{% for i in range(50000) %}{% if messages[0].content %}{% endif %}{% endfor %}"
    with pytest.raises(LimitExceeded, match="render time limit"):
        render(looping, limits)
    # Without a time limit the same loop finishes.
    assert render(looping, RenderLimits(max_render_seconds=None)) == ""


def test_template_size_limit() -> None:
    with pytest.raises(LimitExceeded, match="characters"):
        ChatTemplateRenderer("x" * 101, limits=RenderLimits(max_template_chars=100))


def test_ranges_above_the_sandbox_bound_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="100000"):
        render("{{ range(100001)|length }}")


def test_deep_recursion_is_reported() -> None:
    with pytest.raises(InvalidArgument, match="recursed"):
        render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
