"""The first difference and its likely cause, on the embedded tokenizer's real ids."""

from __future__ import annotations

import pytest

from tokenkeys.limits import Limits
from tokenkeys.parity.compare import first_difference, likely_cause
from tokenkeys.parity.local import served_ids
from tokenkeys.preprocess.preprocessor import Preprocessor
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def pre() -> Preprocessor:
    return load_models([ModelSource.default()], TokenizerOptions(), Limits()).get(None).preprocessor


def _ids(pre: Preprocessor, text: str) -> list[int]:
    return pre.tokenize_prompts([text], add_special_tokens=False)[0].ids


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], []) is None


def test_bos_at_the_start(pre: Preprocessor) -> None:
    bos = pre.tokenizer.specials.bos
    assert bos is not None
    text = _ids(pre, "Hello")
    assert likely_cause(pre, [bos.id, *text], text, 0).startswith("likely: a BOS difference")


def test_eos_and_the_generation_prompt_at_the_end(pre: Preprocessor) -> None:
    eos = pre.tokenizer.specials.eos[0].id
    text = _ids(pre, "Hello")
    cause = likely_cause(pre, [*text, eos], text, len(text))
    assert cause == "likely: an EOS difference (the engine ends with EOS)"
    bare = served_ids(pre, "chat", {"messages": HELLO, "add_generation_prompt": False})[0]
    prompted = served_ids(pre, "chat", {"messages": HELLO})[0]
    index = first_difference(bare, prompted)
    assert index == len(bare)
    extra = len(prompted) - len(bare)
    assert likely_cause(pre, bare, prompted, index) == (
        f"likely: the generation prompt at the end (tokenkeys has {extra} more tokens)"
    )


def test_the_same_text_tokenized_otherwise_and_whitespace(pre: Preprocessor) -> None:
    whole = _ids(pre, "Hello world")
    pieces = _ids(pre, "Hel") + _ids(pre, "lo world")
    index = first_difference(whole, pieces)
    assert index is not None
    assert likely_cause(pre, whole, pieces, index).startswith("likely: the same text tokenized")
    spaced = _ids(pre, "Hello  world")
    index = first_difference(whole, spaced)
    assert index is not None
    assert likely_cause(pre, whole, spaced, index).startswith("likely: whitespace")


def test_a_prologue_and_a_later_difference(pre: Preprocessor) -> None:
    system = [{"role": "system", "content": "Be brief."}, *HELLO]
    default = served_ids(pre, "chat", {"messages": HELLO})[0]
    own = served_ids(pre, "chat", {"messages": system})[0]
    index = first_difference(default, own)
    assert index is not None and index < 16
    assert likely_cause(pre, default, own, index).startswith("likely: the template prologue")
    long = [{"role": "system", "content": "word " * 30}, {"role": "user", "content": "Yes"}]
    other = [long[0], {"role": "user", "content": "No"}]
    a = served_ids(pre, "chat", {"messages": long})[0]
    b = served_ids(pre, "chat", {"messages": other})[0]
    index = first_difference(a, b)
    assert index is not None and index >= 16
    assert likely_cause(pre, a, b, index) == (
        "likely: the chat template (the conversation renders differently)"
    )
