"""Message normalization as vLLM's chat_utils does it (0.33-era main)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.preprocess.chat_messages import media_kind, normalize_messages


def one(message: dict, fmt: str = "string") -> dict:
    (out,) = normalize_messages([message], fmt)  # type: ignore[arg-type]
    return out


def test_string_content() -> None:
    assert one({"role": "user", "content": "hi"}) == {"role": "user", "content": "hi"}
    assert one({"role": "user", "content": "hi"}, "openai") == {
        "role": "user",
        "content": [{"type": "text", "text": "hi"}],
    }


def test_text_parts_join_with_newlines() -> None:
    parts = [
        {"type": "text", "text": "a"},
        "b",
        {"type": "input_text", "text": "c"},
        {"type": "output_text", "text": "d"},
        {"type": "refusal", "refusal": "e"},
        {"type": "thinking", "thinking": "f", "closed": True},
        {"type": "text", "text": None},  # skipped, as vLLM does
        {"type": "refusal"},  # skipped too
    ]
    assert one({"role": "user", "content": parts})["content"] == "a\nb\nc\nd\ne\nf"
    assert one({"role": "user", "content": parts}, "openai")["content"] == [
        {"type": "text", "text": t} for t in "abcdef"
    ]


def test_null_or_missing_content() -> None:
    assert one({"role": "assistant", "content": None})["content"] == ""
    assert one({"role": "assistant"})["content"] == ""
    assert one({"role": "assistant"}, "openai")["content"] == []


def test_tool_reference_parts() -> None:
    parts = [{"type": "tool_reference", "name": "search"}, {"type": "text", "text": "x"}]
    assert one({"role": "user", "content": parts})["content"] == "search\nx"
    assert one({"role": "user", "content": parts}, "openai")["content"] == [
        {"type": "tool_reference", "name": "search"},
        {"type": "text", "text": "x"},
    ]


@pytest.mark.parametrize(
    "part,kind",
    [
        ({"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}, "input_audio"),
        ({"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}, "video_url"),
        ({"type": "file", "file": {"file_id": "f"}}, "file"),
        ({"type": "image"}, "image"),
        ({"type": "audio"}, "audio"),
        ({"type": "text", "text": "x", "uuid": "u", "audio_url": "a"}, "audio_url"),
    ],
)
def test_media_parts_are_unsupported(part: dict, kind: str) -> None:
    assert media_kind(part) == kind
    with pytest.raises(Unsupported) as info:
        one({"role": "user", "content": [{"type": "text", "text": "see"}, part]})
    assert repr(kind) in info.value.message
    assert "messages[0].content[1]" in info.value.message


@pytest.mark.parametrize(
    "part,match",
    [
        ({"type": "video"}, None),
        ({"type": "mystery"}, "not a known content part type"),
        ({"text": "no type"}, "has no 'type'"),
        ({"type": 3, "text": "x"}, "type must be a string"),
        ({"type": "input_text"}, "must be a string"),
        ({"type": "text", "text": 5}, "must be a string"),
        (7, "must be a string or an object"),
    ],
)
def test_malformed_parts(part, match) -> None:
    expected = Unsupported if match is None else InvalidArgument
    with pytest.raises(expected, match=match):
        one({"role": "user", "content": [part]})


def test_kept_keys_and_their_order() -> None:
    message = {
        "role": "assistant",
        "content": "x",
        "name": "bot",
        "task": "t",
        "extra": "dropped",
        "refusal": None,
        "reasoning_content": "why",
    }
    out = one(message)
    assert list(out) == ["role", "content", "reasoning", "reasoning_content", "name", "task"]
    assert out["reasoning"] == out["reasoning_content"] == "why"
    assert "name" not in one({"role": "user", "content": "x", "name": 3})


def test_reasoning_only_for_assistants() -> None:
    assert one({"role": "user", "content": "x", "reasoning": "r"}) == {
        "role": "user",
        "content": "x",
    }


def test_tool_calls_arguments_are_parsed() -> None:
    calls = [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1, 2]}'}},
        {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
        {"id": "3", "type": "function", "function": {"name": "h", "arguments": None}},
        {"id": "4", "type": "function", "function": {"name": "i", "arguments": {"k": 1}}},
        {"id": "5", "type": "function", "function": {"name": "j", "arguments": "5"}},
        {"id": "6", "type": "function", "function": {"name": "k"}},
    ]
    original = [dict(c, function=dict(c["function"])) for c in calls]
    out = one({"role": "assistant", "content": None, "tool_calls": calls})
    assert [c["function"]["arguments"] for c in out["tool_calls"]] == [
        {"a": [1, 2]},
        {},
        {},
        {"k": 1},
        5,
        {},
    ]
    assert out["tool_calls"][0] == {
        "id": "1",
        "type": "function",
        "function": {"name": "f", "arguments": {"a": [1, 2]}},
    }
    assert calls == original  # the request is not modified


def test_empty_tool_calls_are_removed_and_other_roles_ignore_them() -> None:
    assert "tool_calls" not in one({"role": "assistant", "content": "x", "tool_calls": []})
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert "tool_calls" not in one({"role": "user", "content": "x", "tool_calls": [call]})


@pytest.mark.parametrize("calls", [{"a": 1}, [{"id": "1"}], [{"function": {"arguments": "{}"}}]])
def test_malformed_tool_calls(calls) -> None:
    with pytest.raises(InvalidArgument, match="tool_calls"):
        one({"role": "assistant", "content": "x", "tool_calls": calls})


def test_tool_messages() -> None:
    message = {
        "role": "tool",
        "tool_call_id": "c1",
        "content": [{"type": "text", "text": "a"}, "b"],
    }
    assert one(message) == {"role": "tool", "content": "a\nb", "tool_call_id": "c1"}
    # vLLM joins a tool message's text parts even for list-content templates...
    assert one(message, "openai")["content"] == "a\nb"
    # ...unless a part is not text.
    with_ref = {"role": "tool", "content": [{"type": "tool_reference", "name": "s"}]}
    assert one(with_ref, "openai")["content"] == [{"type": "tool_reference", "name": "s"}]
    assert one({"role": "tool", "tool_call_id": None, "content": "x"})["tool_call_id"] is None


def test_developer_tools() -> None:
    assert one({"role": "developer", "content": "x"}) == {
        "role": "developer",
        "content": "x",
        "tools": None,
    }


@pytest.mark.parametrize(
    "messages,match",
    [
        ("hi", "must be a list"),
        (["hi"], r"messages\[0\] must be an object"),
        ([{"content": "x"}], "role must be a string"),
        ([{"role": "user", "content": 5}], "must be a string, a list"),
        ([{"role": "assistant", "content": "x", "reasoning": 1}], "reasoning"),
    ],
)
def test_malformed_messages(messages, match) -> None:
    with pytest.raises(InvalidArgument, match=match):
        normalize_messages(messages, "string")


_texts = st.lists(st.text(max_size=12), min_size=0, max_size=5)


@settings(max_examples=200, deadline=None)
@given(_texts)
def test_parts_and_joined_string_agree(texts: list[str]) -> None:
    parts = [{"type": "text", "text": t} for t in texts]
    as_parts = one({"role": "user", "content": parts})
    as_string = one({"role": "user", "content": "\n".join(texts)})
    assert as_parts == as_string


_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"])},
    optional={
        "content": st.none() | st.text(max_size=8) | st.lists(st.text(max_size=8), max_size=3),
        "name": st.text(max_size=4),
        "reasoning_content": st.text(max_size=4),
        "tool_call_id": st.text(max_size=4),
    },
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_message, min_size=1, max_size=4), st.sampled_from(["string", "openai"]))
def test_normalization_is_idempotent(messages, fmt) -> None:
    once = normalize_messages(messages, fmt)
    assert normalize_messages(once, fmt) == once
