"""Template selection by name and tools, as transformers' get_chat_template."""

from __future__ import annotations

import pytest

from tokenkeys.errors import InvalidArgument
from tokenkeys.tokenizer.chat_template_select import select_template

BOTH = {"default": "D", "tool_use": "T"}


def test_single_default() -> None:
    assert select_template({"default": "D"}, False, None) == "D"
    assert select_template({"default": "D"}, True, None) == "D"


def test_tool_use_only_when_tools_are_given() -> None:
    assert select_template(BOTH, False, None) == "D"
    assert select_template(BOTH, True, None) == "T"


def test_name_selects_or_is_the_template_itself() -> None:
    assert select_template(BOTH, False, "tool_use") == "T"
    assert select_template(BOTH, True, "default") == "D"
    assert select_template(BOTH, False, "{{ messages }}") == "{{ messages }}"
    assert select_template({}, False, "{{ x }}") == "{{ x }}"


def test_no_template() -> None:
    with pytest.raises(InvalidArgument, match="no chat template") as info:
        select_template({}, False, None)
    assert info.value.field == "chat_template"


def test_several_without_default() -> None:
    with pytest.raises(InvalidArgument, match="known: a, b"):
        select_template({"b": "B", "a": "A"}, False, None)
    assert select_template({"b": "B", "tool_use": "T"}, True, None) == "T"
