"""Request shapes to certify: the built-in corpus (every route and prompt option) or a JSONL file.

A shape is ``{"name", "route", "body"}``; ``route`` is one of :data:`ROUTES`. Bodies carry no
``model`` (the command sets the engine's). Tools are sent with ``tool_choice: "none"``, the one
choice vLLM's render server renders without a tool parser (``OnlineRenderer.render_chat``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenkeys.errors import InvalidArgument

#: The routes a shape may name, each rendered by the engine route of the same name.
ROUTES = ("chat", "completions", "messages", "responses")


@dataclass(frozen=True)
class Shape:
    """One request to render on both sides."""

    name: str
    route: str
    body: dict[str, Any] = field(default_factory=dict)


_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
_HELLO = [{"role": "user", "content": "Hello! 東京 🎌"}]
_ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "The weather of a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}

BUILT_IN: tuple[Shape, ...] = (
    Shape("chat-plain", "chat", {"messages": _HELLO}),
    Shape(
        "chat-system",
        "chat",
        {"messages": [{"role": "system", "content": "Answer briefly."}, *_HELLO]},
    ),
    Shape(
        "chat-multi-turn",
        "chat",
        {
            "messages": [
                {"role": "user", "content": "Hi there."},
                {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "Name a prime."},
            ]
        },
    ),
    Shape(
        "chat-tools",
        "chat",
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [_CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
            ],
            "tools": [_WEATHER],
            "tool_choice": "none",
        },
    ),
    Shape(
        "chat-template-kwargs",
        "chat",
        {"messages": _HELLO, "chat_template_kwargs": {"enable_thinking": False}},
    ),
    Shape(
        "chat-no-generation-prompt", "chat", {"messages": _HELLO, "add_generation_prompt": False}
    ),
    Shape(
        "chat-continue-final-message",
        "chat",
        {
            "messages": [*_HELLO, {"role": "assistant", "content": "Bonjour, "}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    Shape("completions-text", "completions", {"prompt": "The capital of France is"}),
    Shape(
        "completions-no-special-tokens",
        "completions",
        {"prompt": "The capital of France is", "add_special_tokens": False},
    ),
    Shape("completions-batch", "completions", {"prompt": ["One.", "  Two, with spaces. "]}),
    Shape(
        "messages-system-blocks",
        "messages",
        {
            "max_tokens": 16,
            "system": [
                {"type": "text", "text": "You are terse. "},
                {"type": "text", "text": "Cite nothing."},
            ],
            "messages": _HELLO,
        },
    ),
    Shape(
        "messages-tools",
        "messages",
        {
            "max_tokens": 16,
            "tools": [_ANTHROPIC_TOOL],
            "tool_choice": {"type": "none"},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me look."},
                        {
                            "type": "tool_use",
                            "id": "toolu_01",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18 C"},
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
            ],
        },
    ),
    Shape(
        "messages-thinking",
        "messages",
        {
            "max_tokens": 16,
            "messages": [
                {"role": "user", "content": "2+2?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Two plus two.", "signature": "s1"},
                        {"type": "text", "text": "4"},
                    ],
                },
                {"role": "user", "content": "And 3+3?"},
            ],
        },
    ),
    Shape(
        "responses-instructions",
        "responses",
        {"instructions": "Answer briefly.", "input": "Hello! 東京 🎌"},
    ),
    Shape(
        "responses-function-call",
        "responses",
        {
            "tools": [{"type": "function", **_WEATHER["function"]}],
            "tool_choice": "none",
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
            ],
        },
    ),
)


def load(path: Path) -> list[Shape]:
    """The shapes of a JSONL file, one ``{"name", "route", "body"}`` object a line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"--corpus {path}: cannot read it: {exc}", field="corpus") from exc
    shapes = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"--corpus {path} line {number}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise InvalidArgument(f"{where}: not JSON: {exc}", field="corpus") from None
        if not isinstance(item, dict) or set(item) != {"name", "route", "body"}:
            raise InvalidArgument(
                f'{where}: expected an object with exactly "name", "route" and "body"',
                field="corpus",
            )
        if not isinstance(item["name"], str) or not item["name"]:
            raise InvalidArgument(f"{where}: name must be a non-empty string", field="corpus")
        if item["route"] not in ROUTES:
            raise InvalidArgument(
                f"{where}: route {item['route']!r} is not one of {', '.join(ROUTES)}",
                field="corpus",
            )
        if not isinstance(item["body"], dict):
            raise InvalidArgument(f"{where}: body must be an object", field="corpus")
        shapes.append(Shape(item["name"], item["route"], item["body"]))
    if not shapes:
        raise InvalidArgument(f"--corpus {path}: no shapes in it", field="corpus")
    return shapes
