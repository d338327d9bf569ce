"""Streamed text: the deltas of IncrementalText add up to the decode of all tokens."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.frontend.streaming import DONE, IncrementalText, sse
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

from conformance_data import data_path

_MODELS = load_models([], TokenizerOptions(), Limits())
SMOLLM = _MODELS.get(None).preprocessor
PHI3 = data_path("tokenizers", "phi-3-mini")


def _decoder(preprocessor, skip: bool):
    return lambda ids: preprocessor.detokenize([ids], skip_special_tokens=skip)[0]


def _stream(decode, ids: list[int], steps: list[int]) -> list[str]:
    text = IncrementalText(decode)
    out, at = [], 0
    for step in steps:
        out.append(text.push(ids[at : at + step]))
        at += step
    out.append(text.push(ids[at:]))
    out.append(text.finish())
    return out


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
    steps=st.lists(st.integers(0, 3), max_size=30),
    skip=st.booleans(),
)
def test_deltas_add_up_to_the_whole_decode(text, steps, skip) -> None:
    """Text with multi-byte characters split over byte tokens, pushed in any step sizes."""
    ids = SMOLLM.tokenize_prompts([text])[0].ids
    decode = _decoder(SMOLLM, skip)
    assert "".join(_stream(decode, ids, steps)) == decode(ids)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, 49151), max_size=30), skip=st.booleans())
def test_arbitrary_ids_add_up_too(ids, skip) -> None:
    decode = _decoder(SMOLLM, skip)
    assert "".join(_stream(decode, ids, [1] * len(ids))) == decode(ids)


def test_an_incomplete_character_is_held_back() -> None:
    ids = SMOLLM.tokenize_prompts(["👩‍👩‍👧"])[0].ids
    text = IncrementalText(_decoder(SMOLLM, False))
    first = text.push(ids[:1])
    assert "\ufffd" not in first
    assert first + text.push(ids[1:]) + text.finish() == "👩‍👩‍👧"


def test_sentencepiece_leading_spaces_survive() -> None:
    models = load_models([ModelSource("phi", PHI3)], TokenizerOptions(), Limits())
    phi = models.get(None).preprocessor
    ids = phi.tokenize_prompts(["Hello big  world 東京"])[0].ids
    decode = _decoder(phi, True)
    assert "".join(_stream(decode, ids, [1] * len(ids))) == decode(ids)


def test_sse_frames() -> None:
    assert sse({"a": "é"}) == b'data: {"a":"\xc3\xa9"}\n\n'
    assert orjson.loads(sse([1])[6:]) == [1]
    assert DONE == b"data: [DONE]\n\n"
