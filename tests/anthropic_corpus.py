"""Anthropic Messages (and OpenAI Responses) requests generated systematically, for parity
with vLLM 0.32.

Every combination of a system form (none, a string, text blocks, a billing header block vLLM
drops), a conversation (one turn, string and block content, multi-turn, tool use and results,
thinking blocks, inline system turns), stop sequences on or off and thinking unset or disabled.
A second set adds tools (with ``tool_choice: none``, the choice a render server without a tool
parser renders) and thinking enabled (count_tokens only: its budget needs a reasoning parser to
generate).
"""

from __future__ import annotations

import itertools
from typing import Any

SYSTEMS: dict[str, Any] = {
    "none": None,
    "string": "You answer in one short sentence.",
    "blocks": [
        {"type": "text", "text": "You are terse. "},
        {"type": "text", "text": "Cite nothing."},
    ],
    "billing": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
        {"type": "text", "text": "You are a coding agent."},
    ],
}

_TOOL_USE = {
    "type": "tool_use",
    "id": "toolu_01",
    "name": "get_weather",
    "input": {"city": "Paris"},
}
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "one-turn": [{"role": "user", "content": "Bonjour! 東京 🎌"}],
    "blocks": [
        {
            "role": "user",
            "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Two."}],
        }
    ],
    "multi-turn": [
        {"role": "user", "content": "Hi there."},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello! How can I help?"}]},
        {"role": "user", "content": [{"type": "text", "text": "Name a prime."}]},
    ],
    "tool-result": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, _TOOL_USE]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18 C, sunny"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ],
    "tool-result-blocks": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [_TOOL_USE]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": [{"type": "text", "text": "18 C"}, {"type": "text", "text": "sun"}],
                }
            ],
        },
    ],
    "thinking": [
        {"role": "user", "content": "Think, then answer: 2+2?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Two plus two is four.", "signature": "s1"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "4"},
            ],
        },
        {"role": "user", "content": "And 3+3?"},
    ],
    "inline-system": [
        {"role": "user", "content": "Hello."},
        {"role": "assistant", "content": "Hi."},
        {"role": "system", "content": "<reminder>Be brief.</reminder>"},
        {"role": "user", "content": "Summarize our talk."},
    ],
    "assistant-prefill": [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "One, two,"},
    ],
}
STOPS: dict[str, list[str] | None] = {"no-stop": None, "stop": ["\n\n", "END"]}
THINKING: dict[str, dict[str, Any] | None] = {
    "thinking-unset": None,
    "thinking-off": {"type": "disabled"},
}
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {"name": "no_schema_type", "input_schema": {"properties": {"x": {"type": "integer"}}}},
]


def messages_requests(max_tokens: int = 8) -> list[tuple[str, dict[str, Any]]]:
    """(label, Messages body) for every combination; 4 x 8 x 2 x 2 = 128 requests."""
    out = []
    for (s, system), (c, conv), (t, stop), (k, thinking) in itertools.product(
        SYSTEMS.items(), CONVERSATIONS.items(), STOPS.items(), THINKING.items()
    ):
        body: dict[str, Any] = {"max_tokens": max_tokens, "messages": conv}
        if system is not None:
            body["system"] = system
        if stop is not None:
            body["stop_sequences"] = stop
        if thinking is not None:
            body["thinking"] = thinking
        out.append((f"{s}-{c}-{t}-{k}", body))
    return out


def tool_requests(max_tokens: int = 8) -> list[tuple[str, dict[str, Any]]]:
    """(label, Messages body) with tools declared and not chosen, per conversation."""
    return [
        (
            f"tools-{c}",
            {
                "max_tokens": max_tokens,
                "messages": conv,
                "tools": TOOLS,
                "tool_choice": {"type": "none"},
            },
        )
        for c, conv in CONVERSATIONS.items()
    ]


def thinking_enabled(max_tokens: int = 2048) -> list[tuple[str, dict[str, Any]]]:
    """(label, Messages body) with extended thinking on, per conversation."""
    thinking = {"type": "enabled", "budget_tokens": 1024}
    return [
        (f"thinking-on-{c}", {"max_tokens": max_tokens, "messages": conv, "thinking": thinking})
        for c, conv in CONVERSATIONS.items()
    ]


# --- OpenAI Responses ------------------------------------------------------------------------


def _said(text: str) -> dict[str, Any]:
    """An assistant turn as a Responses output message (its whole shape, as vLLM requires)."""
    return {
        "type": "message",
        "role": "assistant",
        "id": "msg_1",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _unfinished(text: str) -> dict[str, Any]:
    """An assistant output message still in progress: vLLM continues it (no generation prompt)."""
    return {**_said(text), "status": "in_progress"}


_CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
RESPONSES_INPUTS: dict[str, Any] = {
    "string": "Bonjour! 東京 🎌",
    "message": [{"role": "user", "content": "Hi there."}],
    "input-text": [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Describe caches."}],
        }
    ],
    "multi-turn": [
        {"role": "user", "content": "Hi."},
        _said("Hello!"),
        {"role": "user", "content": "Name a prime."},
    ],
    "tool-call": [
        {"role": "user", "content": "Weather in Paris?"},
        _CALL,
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
    ],
    "reasoning": [
        {"role": "user", "content": "2+2?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Four."}],
        },
        _said("4"),
        {"role": "user", "content": "3+3?"},
    ],
}
_TWO_CALLS = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    _CALL,
    {**_CALL, "call_id": "call_2", "arguments": '{"city": "Rome"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
    {"type": "function_call_output", "call_id": "call_2", "output": "24 C"},
    _said("Paris 18 C, Rome 24 C."),
    {"role": "user", "content": "And tomorrow?"},
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def responses_requests() -> list[tuple[str, dict[str, Any]]]:
    """(label, Responses body): every input form, with and without instructions and tools,
    a few sampling options, reasoning effort, tool_choice none, an unfinished assistant turn
    (continued), parallel calls with their outputs, a system item; 6 x 2 x 2 + 9 requests."""
    out = []
    for (i, given), instructions, tools in itertools.product(
        RESPONSES_INPUTS.items(), (None, "Answer briefly."), (False, True)
    ):
        body: dict[str, Any] = {"input": given}
        if instructions:
            body["instructions"] = instructions
        if tools:
            body["tools"] = RESPONSES_TOOLS
        out.append((f"{i}-instr={bool(instructions)}-tools={tools}", body))
    out += [
        ("sampling", {"input": "Hi", "max_output_tokens": 9, "temperature": 0, "top_p": 0.5}),
        ("stream", {"input": "Hi", "stream": True, "max_output_tokens": 5}),
        ("kwargs", {"input": "Hi", "chat_template_kwargs": {"enable_thinking": False}}),
        ("effort", {"input": "Hi", "reasoning": {"effort": "low"}}),
        (
            "effort-none",
            {"input": [{"role": "user", "content": "Hi"}], "reasoning": {"effort": "none"}},
        ),
        ("tool-choice-none", {"input": "Hi", "tools": RESPONSES_TOOLS, "tool_choice": "none"}),
        (
            "continued",
            {"input": [{"role": "user", "content": "Count to 3."}, _unfinished("1, 2,")]},
        ),
        ("two-calls", {"input": _TWO_CALLS, "tools": RESPONSES_TOOLS}),
        (
            "system-item",
            {
                "input": [
                    {"role": "system", "content": "Be terse."},
                    {"role": "user", "content": "Hi"},
                ]
            },
        ),
        (
            "bare-output-text",
            {"input": [{"role": "assistant", "content": [{"type": "output_text", "text": "x"}]}]},
        ),
    ]
    return out


def usage_total(usage: Any) -> int:
    """Anthropic's prompt total of an ``anthropic`` client ``Usage`` (or ``MessageDeltaUsage``):
    uncached + cache creation + cache read tokens, as vLLM 0.32 splits the prompt."""
    return (
        usage.input_tokens
        + (usage.cache_creation_input_tokens or 0)
        + (usage.cache_read_input_tokens or 0)
    )


async def check_usage_cache(client: Any, model: str) -> None:
    """vLLM 0.32's ``test_anthropic_usage_cache`` (tests/entrypoints/anthropic/test_messages.py)
    over an ``anthropic.AsyncAnthropic`` client: the same prompt twice, the second served from
    the cache, its usage summing to the same whole prompt (Anthropic's total: see
    :func:`usage_total`). Run on the simulated engine and through the sidecar before vLLM."""
    messages = [{"role": "user", "content": " ".join(["Explain streaming caches."] * 5)}]
    resp1 = await client.messages.create(model=model, max_tokens=10, messages=messages)
    assert resp1.usage is not None
    total1 = usage_total(resp1.usage)
    assert total1 > 0
    resp2 = await client.messages.create(model=model, max_tokens=10, messages=messages)
    assert resp2.usage is not None
    cached = resp2.usage.cache_read_input_tokens or 0
    assert cached > 0, "Expected cache_read_input_tokens > 0 on repeated prompt"
    total2 = usage_total(resp2.usage)
    assert total2 == total1, (resp2.usage, total1)
