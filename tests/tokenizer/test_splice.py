"""Cut points: the rules of tokenizer/splice.py, each pinned against the tokenizers library."""

from __future__ import annotations

import sys

import pytest
from tokenizers import AddedToken as LibAddedToken
from tokenizers import Tokenizer as LibTokenizer
from tokenizers import models, pre_tokenizers

from tokenkeys.tokenizer.splice import RUST_WHITESPACE, AddedTokenMatch, SplicePlan


def _plan(*tokens: AddedTokenMatch, split_special_tokens: bool = False) -> SplicePlan:
    return SplicePlan.build(tokens, split_special_tokens=split_special_tokens, prefix=(), suffix=())


def _special(content: str, **flags: bool) -> AddedTokenMatch:
    return AddedTokenMatch(content, special=True, normalized=False, **flags)


def test_rust_whitespace_is_what_the_library_strips() -> None:
    """Every character Python or Unicode calls a space: absorbed by rstrip iff in the set."""
    tok = LibTokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.add_special_tokens([LibAddedToken("<e>", rstrip=True, normalized=False)])
    spaces = {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()} | RUST_WHITESPACE
    for ch in sorted(spaces):
        offsets = tok.encode(f"<e>{ch}x", add_special_tokens=False).offsets
        absorbed = offsets[0] == (0, 4)
        assert absorbed == (ch in RUST_WHITESPACE), hex(ord(ch))


def test_overlapping_specials_never_cut_where_a_longer_one_may_match() -> None:
    plan = _plan(_special("<|"), _special("<|EOS|>"), _special("|>"))
    # "<|" at the end is a match of this text, so a cut; the longer text is other pieces.
    assert plan.pieces("a<|") == ["a<|"]
    assert plan.pieces("a<|EOS|>b") == ["a<|EOS|>", "b"]
    # "|>" overlapped by "<|EOS|>" is no match, hence no cut after it.
    assert plan.cuts("x<|EOS|>") == [8]
    assert dict(plan.boundaries["|>"].threats)["<|EOS|>"] == 5


def test_a_token_overlapping_itself_is_a_threat_to_itself() -> None:
    plan = _plan(_special("aa"))
    assert ("aa", 1) in plan.boundaries["aa"].threats
    # "aa" at 1 is the leftmost match; the one at 2 starts inside it and is skipped by the scan.
    assert plan.cuts("xaaa") == [3]


def test_rstrip_cuts_after_the_whitespace_it_absorbs() -> None:
    plan = _plan(_special("<e>", rstrip=True))
    assert plan.cuts("a<e> \n\tb") == [7]
    assert plan.cuts("a<e>\x1cb") == [4]  # U+001C is Python's space, not Rust's


def test_rstrip_cuts_are_refused_when_a_token_starts_with_whitespace() -> None:
    plan = _plan(
        _special("<e>", rstrip=True), AddedTokenMatch(" x", special=False, normalized=False)
    )
    assert plan.cuts("a<e>  b") == []
    assert plan.cuts("a<e>b") == [4]


def test_single_word_tokens_never_cut_and_guard_the_character_before_a_cut() -> None:
    plan = _plan(
        AddedTokenMatch("hi", special=False, normalized=False, single_word=True), _special("<x>")
    )
    assert "hi" not in plan.boundaries
    assert plan.cuts("a<x>hi") == [4]  # '>' is no word character
    word_end = _plan(
        AddedTokenMatch("hi", special=False, normalized=False, single_word=True), _special("<x")
    )
    assert word_end.cuts("a<xhi") == []  # 'x' is: the single_word "hi" after it reads it


def test_normalized_and_split_special_tokens_do_not_cut() -> None:
    plan = _plan(
        AddedTokenMatch("fox", special=False, normalized=True),
        _special("<s>"),
        AddedTokenMatch("<t>", special=False, normalized=False),
        split_special_tokens=True,
    )
    assert set(plan.boundaries) == {"<t>"}
    # "<s>" still takes part in the scan: it threatens "<t>"? no; but it is a pattern.
    assert plan.cuts("a<s>b<t>c") == [8]


@pytest.mark.parametrize("content", [" lead", "trail ", "\n"])
def test_tokens_with_whitespace_at_an_end_do_not_cut(content: str) -> None:
    assert _plan(_special(content)).boundaries == {}


def test_thousands_of_added_tokens_cut_like_a_few() -> None:
    """The finder is a trie: the longest token at a position wins, as in the library."""
    many = [_special(f"<unused{i}>") for i in range(3000)]
    plan = _plan(*many, _special("<|"), _special("<|EOS|>"))
    text = "a<|EOS|>b<unused123>c<unused1234>d<|x<unused9999>"
    assert plan.pieces(text) == [
        "a<|EOS|>",
        "b<unused123>",
        "c<unused1234>",
        "d<|",
        "x<unused9999>",
    ]
