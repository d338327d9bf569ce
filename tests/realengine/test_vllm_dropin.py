"""Issue 13 side by side: the same request to vLLM 0.32 and to tokenkeys, the answers compared.

The pair of servers of ``served_pair`` (vLLM serving the tiny model, ``tokenkeys serve`` on the
same tokenizer folder under the same name). Each test pins one drop-in behaviour that
``tests/frontend/test_frontend_vllm_dropin.py`` tests against tokenkeys alone: where the prompt
ids appear, token-in chat, the context rules, refusals with their messages, token spellings,
request ids and prompt text.
"""

from __future__ import annotations

import json

import pytest

from served_pair import ok
from vllm_server import DEFAULT_CONFIG, MAX_MODEL_LEN

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(DEFAULT_CONFIG)]

USER = [{"role": "user", "content": "Bonjour! 東京 🎌"}]


def _events(client, path: str, body: dict) -> list[dict]:  # noqa: ANN001 - httpx.Client
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        raw = response.read().decode()
    frames = [f[6:] for f in raw.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def _both_streams(pair, path: str, body: dict) -> tuple[list[dict], list[dict]]:  # noqa: ANN001
    body = {"model": "tiny", **body, "stream": True}
    return _events(pair.engine, path, body), _events(pair.ours, path, body)


def _error(response) -> dict:  # noqa: ANN001 - httpx.Response
    assert response.status_code == 400, response.text
    return response.json()["error"]


# --- 1. prompt_token_ids --------------------------------------------------------------------


def test_completion_prompt_ids_per_choice_alike(pair) -> None:
    body = {"prompt": ["one prompt", "another, longer prompt"], "max_tokens": 2}
    theirs, ours = pair.both("/v1/completions", {**body, "return_token_ids": True})
    want = [c["prompt_token_ids"] for c in ok(theirs)["choices"]]
    assert [c["prompt_token_ids"] for c in ok(ours)["choices"]] == want
    assert ok(ours).get("prompt_token_ids") is None


def test_completion_stream_prompt_ids_in_each_choices_first_chunk_alike(pair) -> None:
    body = {"prompt": ["one prompt", "another prompt"], "max_tokens": 3, "return_token_ids": True}
    theirs, ours = _both_streams(pair, "/v1/completions", body)

    def firsts(chunks: list[dict]) -> dict[int, list]:
        seen: dict[int, list] = {}
        for chunk in chunks:
            for choice in chunk["choices"]:
                seen.setdefault(choice["index"], []).append(choice.get("prompt_token_ids"))
        return {i: [ids for ids in got if ids is not None] for i, got in seen.items()}

    assert firsts(ours) == firsts(theirs)
    assert all(len(ids) == 1 for ids in firsts(theirs).values())


def test_chat_prompt_ids_at_the_top_and_in_the_first_chunk_alike(pair) -> None:
    body = {"messages": USER, "max_tokens": 3, "return_token_ids": True}
    theirs, ours = pair.both("/v1/chat/completions", body)
    assert ok(ours)["prompt_token_ids"] == ok(theirs)["prompt_token_ids"]
    theirs_chunks, ours_chunks = _both_streams(pair, "/v1/chat/completions", body)
    assert ours_chunks[0]["prompt_token_ids"] == theirs_chunks[0]["prompt_token_ids"]
    assert ours_chunks[0]["prompt_token_ids"] == ok(theirs)["prompt_token_ids"]


# --- 2. token-in chat -------------------------------------------------------------------------


def test_token_in_chat_alike(pair) -> None:
    ids = ok(pair.ours.post("/tokenize", json={"prompt": "Reused prompt ids"}))["tokens"]
    body = {
        "messages": USER,
        "max_tokens": 2,
        "return_token_ids": True,
        "kv_transfer_params": {"prompt_token_ids": ids},
    }
    theirs, ours = pair.both("/v1/chat/completions", body)
    assert ok(theirs)["prompt_token_ids"] == ids
    assert ok(ours)["prompt_token_ids"] == ids
    assert ok(ours)["usage"]["prompt_tokens"] == ok(theirs)["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("ids", [[], [1, -2], "1 2", [1, 10**9]])
def test_bad_token_in_ids_refused_alike(pair, ids) -> None:
    body = {"messages": USER, "max_tokens": 2, "kv_transfer_params": {"prompt_token_ids": ids}}
    theirs, ours = pair.both("/v1/chat/completions", body)
    want, got = _error(theirs), _error(ours)
    assert (got["message"], got["param"]) == (want["message"], want["param"])


# --- 3. the context -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "hi", "max_tokens": MAX_MODEL_LEN + 1},
        {"prompt": [5] * (MAX_MODEL_LEN + 1), "max_tokens": 1},
        {"prompt": [5] * (MAX_MODEL_LEN + 2), "max_tokens": 1},
        {"prompt": [5] * MAX_MODEL_LEN, "max_tokens": 1},
    ],
    ids=["max_tokens", "prompt one over", "prompt two over", "full"],
)
def test_context_refusals_have_vllms_message_and_param(pair, body) -> None:
    theirs, ours = pair.both("/v1/completions", body)
    want, got = _error(theirs), _error(ours)
    assert (got["message"], got["param"], got["type"]) == (
        want["message"],
        want["param"],
        want["type"],
    )


def test_chat_budget_over_the_context_alike(pair) -> None:
    body = {"messages": USER, "max_completion_tokens": MAX_MODEL_LEN + 1}
    theirs, ours = pair.both("/v1/chat/completions", body)
    want, got = _error(theirs), _error(ours)
    assert (got["message"], got["param"]) == (want["message"], want["param"])


# --- 4. served names --------------------------------------------------------------------------


def test_models_and_unknown_models_alike(pair) -> None:
    theirs = ok(pair.engine.get("/v1/models"))
    ours = ok(pair.ours.get("/v1/models"))
    assert [m["id"] for m in ours["data"] if m.get("parent") is None] == [
        m["id"] for m in theirs["data"] if m.get("parent") is None
    ]
    theirs, ours = pair.both("/v1/completions", {"model": "nope", "prompt": "x"})
    assert ours.status_code == theirs.status_code == 404
    want, got = theirs.json()["error"], ours.json()["error"]
    assert (got["type"], got["param"]) == (want["type"], want["param"])


# --- 5. refusals with vLLM's messages ----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": ""}),
        ("/v1/completions", {"prompt": "def f(", "suffix": "return 1"}),
        ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}),
        ("/v1/chat/completions", {"messages": USER, "tools": []}),
        ("/v1/chat/completions", {"messages": USER, "tool_choice": "required"}),
    ],
    ids=["empty prompt", "suffix", "stream_options", "tools []", "tool_choice without tools"],
)
def test_refused_with_vllms_message(pair, path, body) -> None:
    theirs, ours = pair.both(path, {"max_tokens": 1, **body})
    want, got = _error(theirs), _error(ours)
    assert got["param"] == want["param"]
    # A request validator's refusal reaches vLLM's client as pydantic's error list (type
    # "Bad Request") around the validator's text; tokenkeys sends the text alone.
    assert got["message"] in want["message"], (want, got)


def test_tool_call_arguments_as_an_object_refused_alike(pair) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
    for path in ("/v1/chat/completions", "/tokenize"):
        theirs, ours = pair.both(path, {"messages": messages, "max_tokens": 1})
        assert theirs.status_code == ours.status_code == 400, (theirs.text, ours.text)
    as_text = {**call, "function": {"name": "f", "arguments": '{"a": 1}'}}
    messages[1]["tool_calls"] = [as_text]
    theirs, ours = pair.both("/tokenize", {"messages": messages})
    assert ok(ours)["tokens"] == ok(theirs)["tokens"]


# --- 6. token_strs ----------------------------------------------------------------------------


def test_vocabulary_token_strs_are_vllms(pair) -> None:
    body = {"prompt": "Hello world, this is tokenkeys", "return_token_strs": True}
    theirs = ok(pair.engine.post("/tokenize", json={"model": "tiny", **body}))
    ours = ok(
        pair.ours.post("/tokenize", json={"model": "tiny", **body, "token_strs_kind": "vocabulary"})
    )
    assert ours["tokens"] == theirs["tokens"]
    assert ours["token_strs"] == theirs["token_strs"]


# --- request ids and prompt text ---------------------------------------------------------------


def test_request_id_and_prompt_text_alike(pair) -> None:
    body = {"messages": USER, "max_tokens": 1, "request_id": "abc", "return_prompt_text": True}
    theirs, ours = pair.both("/v1/chat/completions", body)
    assert ok(ours)["id"] == ok(theirs)["id"]
    assert ok(ours)["prompt_text"] == ok(theirs)["prompt_text"]


# --- Answer shapes (issue 34): every key vLLM sends, null where vLLM sends null ---------------


def _keys(answer: dict) -> dict[str, set]:
    """The keys of a whole answer, of its first choice and of that choice's message."""
    choice = answer["choices"][0]
    return {
        "answer": set(answer),
        "choice": set(choice),
        "message": set(choice.get("message") or {}),
    }


@pytest.mark.parametrize("return_token_ids", [None, False, True])
@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/completions", {"prompt": "Hello"}), ("/v1/chat/completions", {"messages": USER})],
    ids=["completions", "chat"],
)
def test_whole_answers_have_vllms_keys(pair, path: str, body: dict, return_token_ids) -> None:
    sent = {**body, "max_tokens": 2}
    if return_token_ids is not None:
        sent["return_token_ids"] = return_token_ids
    theirs, ours = pair.both(path, sent)
    assert _keys(ok(ours)) == _keys(ok(theirs))
    for key in ("prompt_token_ids", "token_ids"):
        where = ok(ours) if key in ok(ours) else ok(ours)["choices"][0]
        assert (where[key] is None) == (not return_token_ids)
