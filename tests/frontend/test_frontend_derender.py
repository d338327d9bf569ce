"""Derender (issue 34) on a real loopback server: vLLM 0.32's own derender tests, assertions
unchanged (:mod:`derender_cases`), and its incremental-detokenization tests
(``test_derender_stream.py`` ``TestDetokenizeDelta``: a chunked decode equals the one-shot
decode) on :mod:`tokenkeys.derender.incremental`; the refusals (501 naming the field)."""

from __future__ import annotations

from collections.abc import Iterator

import derender_cases
import httpx
import pytest

from tokenkeys.derender.incremental import Window, advance
from tokenkeys.derender.pieces import Pieces, pieces_of, special_tokens
from tokenkeys.preprocess.preprocessor import Preprocessor

from http_support import served_as

NAME = "smollm2"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[httpx.Client, Preprocessor]]:
    with served_as(NAME) as (c, models):
        yield c, models.get(None).preprocessor


@pytest.mark.parametrize("name", sorted(derender_cases.CASES))
def test_vllm_derender_case(served, name: str) -> None:
    derender_cases.CASES[name](served[0], NAME)


# --- TestDetokenizeDelta: chunked == one shot --------------------------------------------------


@pytest.fixture(scope="module")
def codec(served) -> Pieces:
    return pieces_of(served[1].tokenizer)


def _encode(pre: Preprocessor, text: str) -> list[int]:
    return pre.tokenize_prompts([text], add_special_tokens=False)[0].ids


def _one_shot(pre: Preprocessor, ids: list[int]) -> str:
    return pre.detokenize([ids], skip_special_tokens=True)[0]


def _chunked(codec: Pieces, chunks: list[list[int]]) -> str:
    window, parts = Window(), []
    for delta in chunks:
        text, window = advance(codec, window, delta, skip=True)
        parts.append(text)
    return "".join(parts)


@pytest.mark.parametrize(
    ("text", "split"),
    [
        ("Hello world", "whole"),
        ("Hello world from streaming derender", "halves"),
        ("incremental detokenization test", "tokens"),
        ("Hello ✅ world 日本語", "tokens"),
        ("parallel streams", "halves"),
    ],
)
def test_chunked_decode_equals_one_shot(served, codec: Pieces, text: str, split: str) -> None:
    ids = _encode(served[1], text)
    mid = len(ids) // 2
    chunks = {"whole": [ids], "halves": [ids[:mid], ids[mid:]], "tokens": [[t] for t in ids]}
    assert _chunked(codec, chunks[split]) == _one_shot(served[1], ids)


def test_empty_delta_keeps_the_state(served, codec: Pieces) -> None:
    _, window = advance(codec, Window(), _encode(served[1], "Hello")[:4], skip=True)
    text, after = advance(codec, window, [], skip=True)
    assert text == "" and after == window


def test_the_window_stays_bounded(served, codec: Pieces) -> None:
    ids = _encode(served[1], "a reasonably long ascii stream of tokens " * 4)
    assert len(ids) > 32
    window, widest = Window(), 0
    for token in ids:
        _, window = advance(codec, window, [token], skip=True)
        widest = max(widest, len(window.pieces))
        assert window.prefix == 0
    assert widest <= 32


def test_all_special_ids_are_transformers_5s() -> None:
    """The named roles, the extra special tokens and other ``*_token`` entries; not every added
    token tokenizer.json marks special."""
    config = {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>"},
        "additional_special_tokens": ["<a>", "<s>"],
        "image_token": "<img>",
        "add_bos_token": True,
    }
    assert special_tokens(config, {"unk_token": "<unk>", "pad_token": "<p>"}) == [
        "<s>",
        "</s>",
        "<unk>",
        "<p>",
        "<a>",
        "<img>",
    ]
    assert special_tokens({"extra_special_tokens": {"x": "<x>"}}, {}) == ["<x>"]


def test_skipping_specials_keeps_other_added_tokens(served, codec: Pieces) -> None:
    # SmolLM2: <|im_end|> is a named special token, <repo_name> only an added one.
    ids = _encode(served[1], "Hi<repo_name>there<|im_end|>")
    text, _ = advance(codec, Window(), ids, skip=True)
    assert text == "Hi<repo_name>there"
    kept, _ = advance(codec, Window(), ids, skip=False)
    assert kept == "Hi<repo_name>there<|im_end|>"


def test_what_is_not_rebuilt_is_501_naming_the_field(served) -> None:
    for extra, field in (
        ({"metrics": {}}, "metrics"),
        ({"prompt_logprobs": [{}]}, "prompt_logprobs"),
    ):
        answer = {"request_id": "r", "choices": [{"index": 0, "token_ids": [42]}], **extra}
        got = served[0].post("/v1/chat/completions/derender", json={"generate_response": answer})
        assert (got.status_code, got.json()["error"]["param"]) == (501, field), got.text


def _entry(token_id: int, *tops: int) -> dict:
    top = [{"token_id": t, "logprob": -2.0} for t in tops]
    return {"token_id": token_id, "logprob": -1, "top_logprobs": top}


def test_logprobs_are_spelled_and_split_characters_completed(served) -> None:
    """Each sampled token's text, bytes and top candidates; a character whose bytes span
    tokens is read after the tokens before it (the last of its tokens carries it whole)."""
    client, pre = served
    ids = _encode(pre, "Hi 🎌")
    assert len(ids) > 2  # the flag's four bytes span byte tokens
    content = [_entry(i, ids[0]) for i in ids]
    answer = {
        "request_id": "r",
        "choices": [{"index": 0, "token_ids": ids, "logprobs": {"content": content}}],
    }
    got = client.post("/v1/chat/completions/derender", json={"generate_response": answer}).json()
    spelled = got["choices"][0]["logprobs"]["content"]
    assert spelled[0]["token"] == "Hi"
    assert "".join(e["token"] for e in spelled) == "Hi 🎌"
    assert spelled[-1]["token"].endswith("🎌")
    assert all(e["logprob"] == -1.0 and e["top_logprobs"][0]["token"] == "Hi" for e in spelled)
    assert spelled[0]["bytes"] == list(b"Hi")
    completion = client.post(
        "/v1/completions/derender", json={"generate_responses": [answer]}
    ).json()["choices"][0]["logprobs"]
    assert completion["tokens"] == [e["token"] for e in spelled]
    assert completion["text_offset"][0] == 0 and completion["top_logprobs"][0] == {"Hi": -2.0}
