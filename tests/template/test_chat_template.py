"""ChatTemplateRenderer: apply_chat_template's preparation, continue_final_message, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.errors import InvalidArgument
from tokenkeys.template.render import ChatTemplateRenderer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
KEYS = "{% for m in messages %}{{ m|tojson }}\n{% endfor %}"


def test_syntax_error_names_the_line() -> None:
    with pytest.raises(InvalidArgument) as info:
        ChatTemplateRenderer("line one\n{% if %}")
    assert info.value.field == "chat_template"
    assert "syntax error at line 2" in info.value.message


def test_undefined_use_names_the_template_line() -> None:
    renderer = ChatTemplateRenderer("ok\n{{ messages[5].content.strip() }}")
    with pytest.raises(InvalidArgument, match=r"undefined value \(template line 2\)"):
        renderer.render([{"role": "user", "content": "x"}])


def test_runtime_type_errors_are_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="TypeError"):
        ChatTemplateRenderer("{{ 'a' + 1 }}").render([{"role": "user", "content": "x"}])


def test_non_string_template_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        ChatTemplateRenderer(42)  # type: ignore[arg-type]


def test_empty_conversation_is_refused() -> None:
    with pytest.raises(InvalidArgument) as info:
        ChatTemplateRenderer(CHATML).render([])
    assert info.value.field == "messages"


def test_none_values_are_dropped_and_defaults_defined() -> None:
    renderer = ChatTemplateRenderer(
        "{{ messages[0]|tojson }}|{{ add_generation_prompt }}|{{ tools is none }}"
        "|{{ documents is none }}"
    )
    out = renderer.render([{"role": "user", "content": "x", "name": None}])
    assert out == '{"role": "user", "content": "x"}|False|True|True'


def test_special_tokens_and_variables() -> None:
    renderer = ChatTemplateRenderer("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}")
    tokens = {"bos_token": "<s>", "eos_token": "</s>"}
    assert renderer.render([{"role": "user", "content": "x"}], special_tokens=tokens) == "<s>x</s>"
    out = renderer.render(
        [{"role": "user", "content": "x"}], special_tokens=tokens, variables={"eos_token": "!"}
    )
    assert out == "<s>x!"


@pytest.mark.parametrize("name", ["messages", "tools", "documents", "add_generation_prompt"])
def test_variables_may_not_redefine_inputs(name: str) -> None:
    with pytest.raises(InvalidArgument, match=name):
        ChatTemplateRenderer(CHATML).render([{"role": "user", "content": "x"}], variables={name: 1})


def test_tools_and_documents_are_passed_through() -> None:
    renderer = ChatTemplateRenderer("{{ tools|tojson }}|{{ documents|tojson }}")
    tools = [{"type": "function", "function": {"name": "f", "parameters": None}}]
    docs = [{"title": "T", "text": "body"}]
    out = renderer.render([{"role": "user", "content": "x"}], tools=tools, documents=docs)
    assert out == (
        '[{"type": "function", "function": {"name": "f", "parameters": null}}]'
        '|[{"title": "T", "text": "body"}]'
    )
    with pytest.raises(InvalidArgument, match="documents"):
        renderer.render([{"role": "user", "content": "x"}], documents=["text"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="tools"):
        renderer.render([{"role": "user", "content": "x"}], tools=["f"])  # type: ignore[list-item]


def test_reasoning_is_aliased_like_transformers() -> None:
    renderer = ChatTemplateRenderer(KEYS)
    out = renderer.render([{"role": "assistant", "content": "a", "reasoning": "r"}])
    assert out == (
        '{"thinking": "r", "role": "assistant", "content": "a", "reasoning": "r", '
        '"reasoning_content": "r"}\n'
    )
    out = renderer.render([{"role": "assistant", "reasoning_content": "r", "content": "a"}])
    assert (
        out == '{"thinking": "r", "role": "assistant", "reasoning_content": "r", "content": "a"}\n'
    )


def test_non_json_values_become_type_placeholders() -> None:
    out = ChatTemplateRenderer(KEYS).render([{"role": "user", "content": object()}])
    assert out == '{"role": "user", "content": "<object>"}\n'


# --- continue_final_message ---------------------------------------------------------------------


def test_continue_final_message_cuts_after_the_final_content() -> None:
    renderer = ChatTemplateRenderer(CHATML)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Once upon"}]
    assert renderer.render(messages, continue_final_message=True) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nOnce upon"
    )


def test_continue_keeps_trailing_space_when_the_template_keeps_it() -> None:
    renderer = ChatTemplateRenderer(CHATML)
    messages = [{"role": "assistant", "content": "Once upon "}]
    assert renderer.render(messages, continue_final_message=True).endswith("Once upon ")


def test_continue_when_the_template_strips_content() -> None:
    renderer = ChatTemplateRenderer(
        "{% for m in messages %}[{{ m.role }}] {{ m.content.strip() }}</s>{% endfor %}"
    )
    messages = [{"role": "assistant", "content": "Once upon  "}]
    assert renderer.render(messages, continue_final_message=True) == "[assistant] Once upon"


def test_continue_with_list_content_uses_the_last_text_part() -> None:
    renderer = ChatTemplateRenderer(
        "{% for m in messages %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}"
        "{% else %}<img>{% endif %}{% endfor %}<end>{% endfor %}"
    )
    content = [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}, {"type": "image"}]
    messages = [{"role": "assistant", "content": content}]
    assert renderer.render(messages, continue_final_message=True) == "AB"
    assert content[1]["text"] == "B"  # the caller's message is untouched


def test_continue_a_reasoning_field() -> None:
    renderer = ChatTemplateRenderer(
        "{% for m in messages %}<think>{{ m.reasoning_content }}</think>{{ m.content }}{% endfor %}"
    )
    messages = [{"role": "assistant", "content": "", "reasoning_content": "Let me see"}]
    out = renderer.render(messages, continue_final_message="reasoning_content")
    assert out == "<think>Let me see"


@pytest.mark.parametrize(
    "template,messages,match",
    [
        (CHATML, [{"role": "user", "content": None}], 'no "content"'),
        (
            "{% for m in messages %}{{ m.text }}{% endfor %}",
            [{"role": "u", "content": "x"}],
            "never mentions",
        ),
        (
            "{% for m in messages %}{{ m.role }}{% endfor %}{# content #}",
            [{"role": "u", "content": "hello"}],
            "does not appear",
        ),
        (CHATML, [{"role": "u", "content": [{"type": "image"}]}], "no text part"),
        (CHATML, [{"role": "u", "content": 5}], "to be text"),
    ],
)
def test_continue_final_message_errors(template, messages, match) -> None:
    with pytest.raises(InvalidArgument, match=match) as info:
        ChatTemplateRenderer(template).render(messages, continue_final_message=True)
    assert info.value.field == "continue_final_message"


def test_continue_and_generation_prompt_are_exclusive() -> None:
    with pytest.raises(InvalidArgument, match="add_generation_prompt"):
        ChatTemplateRenderer(CHATML).render(
            [{"role": "assistant", "content": "x"}],
            continue_final_message=True,
            add_generation_prompt=True,
        )


_content = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30).filter(
    lambda s: s.strip() and "CONTINUE_FINAL_MESSAGE_TAG" not in s
)


@settings(max_examples=150, deadline=None)
@given(first=_content, final=_content)
def test_continued_render_is_a_prefix_ending_in_the_content(first: str, final: str) -> None:
    renderer = ChatTemplateRenderer(CHATML)
    messages = [{"role": "user", "content": first}, {"role": "assistant", "content": final}]
    continued = renderer.render(messages, continue_final_message=True)
    full = renderer.render(messages)
    assert full.startswith(continued)
    assert continued.endswith(final)
    assert full[len(continued) :] == "<|im_end|>\n"


def test_render_raw_skips_preparation() -> None:
    renderer = ChatTemplateRenderer("{{ messages[0].content is none }}|{{ add_generation_prompt }}")
    assert renderer.render_raw({"messages": [{"content": None}]}) == "True|"
