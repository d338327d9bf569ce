"""Tools shaped as vLLM's ChatCompletionToolsParam dump."""

from __future__ import annotations

import pytest

from tokenkeys.errors import InvalidArgument
from tokenkeys.preprocess.chat_tools import check_tool_choice, normalize_tools


def test_tools_are_dumped_like_vllm() -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "extra": 1}},
        {
            "function": {"name": "g", "description": "G", "parameters": {"type": "object"}},
            "defer_loading": True,
        },
        {"type": "function", "function": {"name": "h", "strict": False}},
    ]
    assert normalize_tools(tools) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": None}},
        {
            "type": "function",
            "function": {
                "name": "g",
                "description": "G",
                "parameters": {"type": "object"},
                "defer_loading": True,
            },
            "defer_loading": True,
        },
        {
            "type": "function",
            "function": {"name": "h", "description": None, "parameters": None, "strict": False},
        },
    ]


def test_no_tools() -> None:
    assert normalize_tools(None) is None
    assert normalize_tools([]) == []


@pytest.mark.parametrize(
    "choice", [None, "none", "auto", "required", {"type": "function", "function": {"name": "f"}}]
)
def test_valid_tool_choices(choice) -> None:
    check_tool_choice(choice)


@pytest.mark.parametrize("choice", ["any", 3, {"type": "function"}, {"function": {"name": 1}}])
def test_invalid_tool_choices(choice) -> None:
    with pytest.raises(InvalidArgument, match="tool_choice"):
        check_tool_choice(choice)
