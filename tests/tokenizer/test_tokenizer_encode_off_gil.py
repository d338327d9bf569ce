"""The tokenizers backend encodes through ``encode_batch`` / ``encode_batch_fast`` (both release
the GIL; the fast one, used when no offsets are asked for, skips tracking them) for one text
too; this proves that changes nothing in what a text becomes. The effect on other requests is
proven end to end in tests/transport/test_front_door_attacks.py (/health p99 beside a
maximum-size /tokenize)."""

from __future__ import annotations

import pytest
import tokenizers

from tokenkeys.tokenizer import Tokenizer, Truncation, default_tokenizer_path

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nnewlines  ",
    "日本語のテキスト、混在 mixed text 🙂",
    "<|im_start|>user\nspecial tokens typed as text<|im_end|>",
    "nul \x00 inside",
    "",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.load(default_tokenizer_path())


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("specials", [True, False])
def test_one_text_encodes_as_the_library_encodes_it(
    tokenizer: Tokenizer, text: str, specials: bool
) -> None:
    library = tokenizers.Tokenizer.from_file(str(default_tokenizer_path() / "tokenizer.json"))
    expected = library.encode(text, add_special_tokens=specials)
    (got,) = tokenizer.encode([text], add_special_tokens=specials, offsets=True)
    assert got.ids == expected.ids
    assert got.offsets == [tuple(o) for o in expected.offsets]
    (fast,) = tokenizer.encode([text], add_special_tokens=specials)
    assert fast.ids == expected.ids and fast.offsets is None


def test_truncation_still_keeps_the_specials(tokenizer: Tokenizer) -> None:
    (full,) = tokenizer.encode([TEXTS[2]], add_special_tokens=True)
    (cut,) = tokenizer.encode([TEXTS[2]], add_special_tokens=True, truncation=Truncation(5, "left"))
    assert len(cut.ids) == min(5, len(full.ids))
    assert cut.ids[-1] == full.ids[-1]
