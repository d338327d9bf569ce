"""The Messages-to-chat conversion, on vLLM 0.32's own conversion tests.

Ported from ``tests/entrypoints/anthropic/test_anthropic_messages_conversion.py``
(vllm-project/vllm, the 0.32 line) with the assertions unchanged: vLLM's
``to_chat_completion_request`` returns a ``ChatCompletionRequest`` (``result.messages``), ours
the chat body (``result["messages"]``); bodies are validated by our schema first, as vLLM's
are by its pydantic models. The render of the whole conversion is compared with vLLM's own, byte
for byte, in ``tests/realengine/test_vllm_render.py``.
"""

from __future__ import annotations

import pytest

from tokenkeys.errors import InvalidArgument
from tokenkeys.frontend.body import validate
from tokenkeys.frontend.schemas_anthropic import MessagesRequest
from tokenkeys.preprocess.anthropic import image_url, needs_system_first, to_chat_request


def _make_request(messages: list[dict], **kwargs) -> dict:
    body = {"model": "test-model", "max_tokens": 128, "messages": messages, **kwargs}
    validate(MessagesRequest, body)
    return body


def _convert(body: dict, merge_inline_system: bool = False) -> dict:
    return to_chat_request(body, merge_inline_system=merge_inline_system)


# --- image sources ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "url"),
    [
        (
            {"type": "base64", "media_type": "image/jpeg", "data": "iVBORw0KGgo="},
            "data:image/jpeg;base64,iVBORw0KGgo=",
        ),
        (
            {"type": "base64", "media_type": "image/png", "data": "AAAA"},
            "data:image/png;base64,AAAA",
        ),
        ({"type": "url", "url": "https://example.com/image.jpg"}, "https://example.com/image.jpg"),
        ({"media_type": "image/webp", "data": "UklGR"}, "data:image/webp;base64,UklGR"),
        ({"type": "base64", "data": "abc123"}, "data:image/jpeg;base64,abc123"),
        ({"type": "url"}, ""),
        ({}, "data:image/jpeg;base64,"),
    ],
)
def test_convert_image_source_to_url(source: dict, url: str) -> None:
    assert image_url(source) == url


def test_base64_image_in_user_message() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/jpeg", "data": "iVBORw0KGgo="},
    }
    request = _make_request(
        [{"role": "user", "content": [{"type": "text", "text": "Describe this image"}, image]}]
    )
    result = _convert(request)
    user_msg = result["messages"][0]
    assert user_msg["role"] == "user"
    parts = user_msg["content"]
    assert len(parts) == 2
    assert parts[0] == {"type": "text", "text": "Describe this image"}
    assert parts[1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/jpeg;base64,iVBORw0KGgo="},
    }


def test_vllm_xargs_passed_through() -> None:
    xargs = {"kv_cache_report_mode": "full", "existing_extension": 7}
    request = _make_request([{"role": "user", "content": "Hello"}], vllm_xargs=xargs)
    assert _convert(request)["vllm_xargs"] == xargs


# --- tool_result content ---------------------------------------------------------------------


def _tool_result_request(tool_result_content) -> dict:  # noqa: ANN001 - any content form
    return _make_request(
        [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_001",
                        "name": "read_file",
                        "input": {"path": "/tmp/img.png"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_001",
                        "content": tool_result_content,
                    }
                ],
            },
        ]
    )


def _tools(result: dict) -> list[dict]:
    return [m for m in result["messages"] if m["role"] == "tool"]


def _follow_ups(result: dict) -> list[dict]:
    return [
        m for m in result["messages"] if m["role"] == "user" and isinstance(m.get("content"), list)
    ]


def test_tool_result_string_content() -> None:
    tool_msg = _tools(_convert(_tool_result_request("file contents here")))
    assert len(tool_msg) == 1
    assert tool_msg[0]["content"] == "file contents here"
    assert tool_msg[0]["tool_call_id"] == "call_001"


def test_tool_result_text_blocks() -> None:
    blocks = [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}]
    tool_msg = _tools(_convert(_tool_result_request(blocks)))
    assert len(tool_msg) == 1
    assert tool_msg[0]["content"] == "line 1\nline 2"


def test_tool_result_with_image() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
    }
    result = _convert(_tool_result_request([image]))
    tool_msg = _tools(result)
    assert len(tool_msg) == 1
    assert tool_msg[0]["content"] == ""
    follow_up = _follow_ups(result)
    assert len(follow_up) == 1
    img_parts = follow_up[0]["content"]
    assert len(img_parts) == 1
    assert img_parts[0] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AAAA"},
    }


def test_tool_result_with_multiple_images() -> None:
    result = _convert(
        _tool_result_request(
            [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "IMG1"},
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/img2.jpg"}},
            ]
        )
    )
    follow_up = _follow_ups(result)
    assert len(follow_up) == 1
    urls = [p["image_url"]["url"] for p in follow_up[0]["content"]]
    assert urls == ["data:image/png;base64,IMG1", "https://example.com/img2.jpg"]


def test_tool_result_none_content() -> None:
    tool_msg = _tools(_convert(_tool_result_request(None)))
    assert len(tool_msg) == 1
    assert tool_msg[0]["content"] == ""


def test_tool_result_no_follow_up_when_no_images() -> None:
    result = _convert(_tool_result_request([{"type": "text", "text": "just text"}]))
    assert len(_follow_ups(result)) == 0


def test_tool_use_arguments_are_pythons_json_dumps() -> None:
    (assistant, _) = _convert(_tool_result_request("x"))["messages"][:2]
    call = assistant["tool_calls"][0]
    assert call == {
        "id": "call_001",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "/tmp/img.png"}'},
    }


# --- system ----------------------------------------------------------------------------------


def test_billing_header_stripped_from_system() -> None:
    request = _make_request(
        [{"role": "user", "content": "Hello"}],
        system=[
            {"type": "text", "text": "You are a helpful assistant."},
            {
                "type": "text",
                "text": "x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli;",
            },
        ],
    )
    system_msg = _convert(request)["messages"][0]
    assert system_msg["role"] == "system"
    assert system_msg["content"] == "You are a helpful assistant."


def test_system_without_billing_header_unchanged() -> None:
    request = _make_request(
        [{"role": "user", "content": "Hello"}],
        system=[
            {"type": "text", "text": "You are a helpful assistant."},
            {"type": "text", "text": " Be concise."},
        ],
    )
    assert _convert(request)["messages"][0]["content"] == "You are a helpful assistant. Be concise."


def test_inline_system_merged_only_when_the_template_needs_it() -> None:
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Reminder."},
        {"role": "user", "content": "Again"},
    ]
    request = _make_request(turns, system="Top.")
    kept = _convert(request)["messages"]
    assert [m["role"] for m in kept] == ["system", "user", "system", "user"]
    merged = _convert(request, merge_inline_system=True)["messages"]
    assert merged[0] == {"role": "system", "content": "Top.Reminder."}
    assert [m["role"] for m in merged] == ["system", "user", "user"]


def test_system_first_detection() -> None:
    guarded = (
        "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('System message must be first') }}{% endif %}{{ m.content }}"
        "{% endfor %}"
    )
    assert needs_system_first(guarded)
    assert needs_system_first(None)
    assert not needs_system_first("{% for m in messages %}{{ m.content }}{% endfor %}")


# --- thinking, tools, choice -----------------------------------------------------------------


def test_thinking_blocks_become_reasoning_and_redacted_are_dropped() -> None:
    request = _make_request(
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Let me think.", "signature": "s"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Answer."},
                ],
            },
        ]
    )
    assistant = _convert(request)["messages"][1]
    assert assistant == {"role": "assistant", "reasoning": "Let me think.", "content": "Answer."}


def test_tools_and_choices() -> None:
    tools = [{"name": "f", "input_schema": {"properties": {}}}]
    request = _make_request([{"role": "user", "content": "Hi"}], tools=tools)
    chat = _convert(request)
    assert chat["tool_choice"] == "auto"
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": None,
                "parameters": {"properties": {}, "type": "object"},
                "strict": None,
                "defer_loading": None,
            },
        }
    ]
    for given, want in [
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ]:
        chat = _convert({**request, "tool_choice": given})
        assert chat["tool_choice"] == want
        assert chat["parallel_tool_calls"] is True


def test_sampling_fields_and_thinking() -> None:
    request = _make_request(
        [{"role": "user", "content": "Hi"}],
        stop_sequences=["END"],
        temperature=0.5,
        top_k=3,
        metadata={"user_id": "u"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        max_tokens=2048,
    )
    chat = _convert(request)
    assert chat["stop"] == ["END"]
    assert chat["max_tokens"] == chat["max_completion_tokens"] == 2048
    assert (chat["temperature"], chat["top_k"]) == (0.5, 3)
    assert chat["thinking_token_budget"] == 1024
    assert "metadata" not in chat
    off = _convert({**request, "thinking": {"type": "disabled"}})
    assert off["reasoning_effort"] == "none"


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "bogus"}],
        [{"type": "tool_addition"}],
        [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "f"}}],
    ],
)
def test_bad_blocks_are_refused_naming_the_field(content: list) -> None:
    with pytest.raises(InvalidArgument) as err:
        _make_request([{"role": "user", "content": content}])
    assert "messages" in err.value.message
