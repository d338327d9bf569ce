"""The chat prologue: request → ChatRender → prompt text, as vLLM's chat path does it."""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.errors import ConfigError, InvalidArgument, Unsupported, status_of
from tokenkeys.preprocess.chat import ChatOptions, ChatPrologue, unsupported_reason

from conformance_data import data_path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Shows what a template receives: every variable this test suite cares about.
PROBE = (
    "{{ messages|tojson }}|agp={{ add_generation_prompt }}|tools={{ tools|tojson }}"
    "|docs={{ documents|tojson }}|think={{ enable_thinking }}|effort={{ reasoning_effort }}"
    "|custom={{ custom }}|bos={{ bos_token }}"
)
LIST_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}:{% for p in m.content %}[{{ p.type }}:{{ p.text }}]"
    "{% endfor %};{% endfor %}"
)
USER = [{"role": "user", "content": "hi"}]


def prologue(template: str = PROBE, **options) -> ChatPrologue:
    return ChatPrologue({"default": template}, {"bos_token": "<s>"}, ChatOptions(**options))


def run(request: dict, template: str = PROBE, **options) -> str:
    p = prologue(template, **options)
    return p.render(p.prepare(request))


# --- flags ---


def test_defaults() -> None:
    chat = prologue().prepare({"messages": USER})
    assert chat.add_generation_prompt is True and chat.continue_final_message is False
    out = prologue().render(chat)
    assert out.startswith('[{"role": "user", "content": "hi"}]|agp=True|tools=null|docs=null')
    assert out.endswith("|custom=|bos=<s>")


def test_continue_final_message_needs_generation_prompt_off() -> None:
    request = {"messages": USER + [{"role": "assistant", "content": "Hel"}]}
    with pytest.raises(InvalidArgument, match="add_generation_prompt: false"):
        prologue(CHATML).prepare({**request, "continue_final_message": True})
    out = run({**request, "continue_final_message": True, "add_generation_prompt": False}, CHATML)
    assert out.endswith("<|im_start|>assistant\nHel")


@pytest.mark.parametrize("field", ["add_generation_prompt", "continue_final_message"])
def test_flags_must_be_booleans(field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        prologue().prepare({"messages": USER, field: "yes"})


# --- unsupported ---


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"mm_processor_kwargs": {"num_crops": 4}}, "mm_processor_kwargs"),
        ({"media_io_kwargs": {"video": {"num_frames": 8}}}, "media_io_kwargs"),
        ({"chat_template_kwargs": {"max_length": 10}}, "chat_template_kwargs.max_length"),
        ({"chat_template_kwargs": {"truncation": True}}, "truncation"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "'image_url' at messages[0].content[0]",
        ),
    ],
)
def test_unsupported_reason(extra: dict, needle: str) -> None:
    request = {"messages": USER, **extra}
    reason = unsupported_reason(request)
    assert reason is not None and needle in reason
    with pytest.raises(Unsupported) as info:
        prologue().prepare(request)
    assert status_of(info.value)[1] == 501


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"mm_processor_kwargs": {}},
        {"media_io_kwargs": None},
        {"chat_template_kwargs": {"truncation": False, "max_length": None, "padding": False}},
        {"messages": "malformed"},
        {"messages": [{"role": "user", "content": [None, 3, {"type": "text", "text": "x"}]}]},
    ],
)
def test_supported_requests_have_no_reason(extra: dict) -> None:
    assert unsupported_reason({"messages": USER, **extra}) is None


# --- chat templates and trust ---


def test_request_templates_need_trust() -> None:
    for request in (
        {"messages": USER, "chat_template": CHATML},
        {"messages": USER, "chat_template_kwargs": {"chat_template": CHATML}},
    ):
        with pytest.raises(InvalidArgument, match="--trust-request-chat-template"):
            prologue().prepare(request)
        out = run(request, trust_request_chat_template=True)
        assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_request_template_may_name_a_tokenizer_template() -> None:
    p = ChatPrologue(
        {"default": "D", "tool_use": "T{{ tools|length }}", "alt": "A"},
        {},
        ChatOptions(trust_request_chat_template=True),
    )
    assert p.render(p.prepare({"messages": USER})) == "D"
    tool = {"type": "function", "function": {"name": "f"}}
    assert p.render(p.prepare({"messages": USER, "tools": [tool]})) == "T1"
    with pytest.raises(InvalidArgument, match="must not be an empty array"):
        p.prepare({"messages": USER, "tools": []})  # vLLM 0.32 check_tool_usage
    assert p.render(p.prepare({"messages": USER, "chat_template": "alt"})) == "A"


def test_server_template_wins_over_the_tokenizers() -> None:
    p = ChatPrologue({"default": "D"}, {}, ChatOptions(chat_template=CHATML))
    assert p.render(p.prepare({"messages": USER})).startswith("<|im_start|>user")
    with pytest.raises(ConfigError, match="--chat-template"):
        ChatPrologue({"default": "D"}, {}, ChatOptions(chat_template="{% if %}"))


def test_no_template_at_all() -> None:
    with pytest.raises(InvalidArgument, match="no chat template"):
        ChatPrologue({}, {}).prepare({"messages": USER})


# --- chat_template_kwargs ---


def test_kwargs_merge_over_server_defaults() -> None:
    defaults = {"enable_thinking": False, "custom": "server"}
    out = run({"messages": USER}, default_chat_template_kwargs=defaults)
    assert "|think=False|" in out and "|custom=server|" in out
    out = run(
        {"messages": USER, "chat_template_kwargs": {"custom": "request", "enable_thinking": None}},
        default_chat_template_kwargs=defaults,
    )
    # null (and "auto") never override a default
    assert "|think=False|" in out and "|custom=request|" in out
    out = run(
        {"messages": USER, "chat_template_kwargs": {"custom": "auto"}},
        default_chat_template_kwargs=defaults,
    )
    assert "|custom=server|" in out
    # Frozen server defaults reach the template as the JSON they were (lists, not tuples).
    out = run({"messages": USER}, default_chat_template_kwargs={"custom": [1, {"a": [2]}]})
    assert "|custom=[1, {'a': [2]}]|" in out


def test_reasoning_effort_sets_enable_thinking_unless_given() -> None:
    out = run({"messages": USER, "reasoning_effort": "none"}, default_chat_template_kwargs={})
    assert "|think=False|effort=none|" in out
    out = run({"messages": USER, "reasoning_effort": "high"})
    assert "|think=True|effort=high|" in out
    out = run(
        {
            "messages": USER,
            "reasoning_effort": "high",
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    assert "|think=False|effort=high|" in out
    with pytest.raises(InvalidArgument, match="reasoning_effort"):
        prologue().prepare({"messages": USER, "reasoning_effort": "extreme"})


def test_kwargs_are_kept_only_when_the_template_reads_them() -> None:
    p = prologue()
    chat = p.prepare(
        {"messages": USER, "chat_template_kwargs": {"custom": 1, "unused": 2, "return_dict": True}}
    )
    assert dict(chat.variables) == {"custom": 1}


@pytest.mark.parametrize("name", ["tokenize", "messages", "tools", "conversation"])
def test_colliding_kwargs_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument, match=name):
        prologue().prepare({"messages": USER, "chat_template_kwargs": {name: True}})


@pytest.mark.parametrize(
    "defaults",
    [{"chat_template": "x"}, {"tokenize": False}, {"max_length": 3}, {1: "x"}, "nope"],
)
def test_bad_server_defaults(defaults) -> None:
    with pytest.raises(ConfigError):
        ChatOptions(default_chat_template_kwargs=defaults)


def test_documents_from_field_or_kwargs() -> None:
    docs = [{"title": "T", "text": "body"}]
    assert '|docs=[{"title": "T", "text": "body"}]|' in run({"messages": USER, "documents": docs})
    out = run({"messages": USER, "chat_template_kwargs": {"documents": docs}})
    assert '|docs=[{"title": "T", "text": "body"}]|' in out
    out = run({"messages": USER}, default_chat_template_kwargs={"documents": docs})
    assert '|docs=[{"title": "T", "text": "body"}]|' in out
    with pytest.raises(InvalidArgument, match="documents"):
        prologue().prepare({"messages": USER, "documents": "text"})


# --- tools ---


@pytest.mark.parametrize(
    "tools",
    [
        "f",
        [{"type": "code_interpreter"}],
        [{"type": "function"}],
        [{"function": {"name": 1}}],
        [{"function": {"name": "f", "parameters": "x"}}],
    ],
)
def test_malformed_tools(tools) -> None:
    with pytest.raises(InvalidArgument, match="tools"):
        prologue().prepare({"messages": USER, "tools": tools})


def test_tool_choice_none_drops_tools_only_when_configured() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    request = {"messages": USER, "tools": tools, "tool_choice": "none"}
    assert prologue().prepare(request).tools is not None
    assert prologue(exclude_tools_when_tool_choice_none=True).prepare(request).tools is None
    assert (
        prologue(exclude_tools_when_tool_choice_none=True)
        .prepare({**request, "tool_choice": "auto"})
        .tools
        is not None
    )
    with pytest.raises(InvalidArgument, match="tool_choice"):
        prologue().prepare({**request, "tool_choice": "sometimes"})
    named = {"type": "function", "function": {"name": "f"}}
    assert prologue().prepare({**request, "tool_choice": named}).tools is not None


# --- content format ---


def test_list_content_templates_receive_parts() -> None:
    request = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}
    assert run(request, LIST_TEMPLATE) == "user:[text:hi];assistant:;"
    assert run(request, CHATML, content_format="openai").startswith(
        "<|im_start|>user\n[{'type': 'text', 'text': 'hi'}]"
    )
    # Forced to "string", the template iterates the characters of "hi".
    assert run(request, LIST_TEMPLATE, content_format="string") == "user:[:][:];assistant:;"


# --- ChatRender ---


def test_chat_render_is_frozen_and_the_request_untouched() -> None:
    request = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x": 1}'},
                    }
                ],
            },
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "chat_template_kwargs": {"custom": {"deep": [1]}},
    }
    original = copy.deepcopy(request)
    p = prologue()
    chat = p.prepare(request)
    assert request == original
    with pytest.raises(dataclasses.FrozenInstanceError):
        chat.template = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        chat.messages[0]["role"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        chat.variables["custom"]["deep"] = 2  # type: ignore[index]
    assert p.render(chat) == p.render(chat) == p.render(p.prepare(request))
    assert '"arguments": {"x": 1}' in p.render(chat)


def test_render_clock_is_injectable() -> None:
    p = ChatPrologue(
        {"default": "{{ strftime_now('%d %b %Y') }}"}, {}, clock=lambda: datetime(2025, 7, 10)
    )
    assert p.render(p.prepare({"messages": USER})) == "10 Jul 2025"


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=100, deadline=None)
@given(st.lists(_text, min_size=1, max_size=4))
def test_string_and_text_parts_render_the_same(texts: list[str]) -> None:
    p = prologue(CHATML)
    as_parts = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": t} for t in texts]}]
    }
    as_string = {"messages": [{"role": "user", "content": "\n".join(texts)}]}
    assert p.render(p.prepare(as_parts)) == p.render(p.prepare(as_string))


# --- parity with transformers on real tokenizers ---


def test_openai_request_matches_transformers_on_vllm_conversation() -> None:
    """An OpenAI-style request renders as transformers does on vLLM's parsed conversation."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(
        str(data_path("tokenizers", "qwen2.5-instruct")), local_files_only=True
    )
    request = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Réponds en français."}]},
            {"role": "user", "content": "Météo à 東京 ? 🌧"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "東京"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "18°C"}]},
        ],
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": {}}}],
    }
    # What vLLM hands to apply_chat_template for this request (string content format).
    conversation = [
        {"role": "system", "content": "Réponds en français."},
        {"role": "user", "content": "Météo à 東京 ? 🌧"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": {"city": "東京"}},
                }
            ],
        },
        {"role": "tool", "content": "18°C", "tool_call_id": "c1"},
    ]
    tools = [
        {"type": "function", "function": {"name": "weather", "description": None, "parameters": {}}}
    ]
    p = ChatPrologue({"default": tok.chat_template}, tok.special_tokens_map)
    expected = tok.apply_chat_template(
        conversation, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert p.render(p.prepare(request)) == expected
