"""The token floor: never above the real count, and absent wherever it could be."""

from __future__ import annotations

import json

import pytest
import tokenizers

from tokenkeys.tokenizer import Tokenizer, TokenizerOptions, default_tokenizer_path
from tokenkeys.tokenizer.token_floor import token_floor

from conformance_data import data_path

TEXTS = [
    "hello world " * 500,
    "世界和平" * 500,
    "-" * 5000,
    " " * 5000,
    "\x04" * 500 + "ab",  # bytes some vocabularies lack: dropped by the encoder
    "0123456789" * 300,
    "e\u0301" * 1000,  # composes under NFC
    "\u1100\u1161\u11a8" * 500,  # Hangul jamo: NFC's largest shrink
    "🙂🎉" * 800,
    "<|im_start|>user\n" * 300,
]


@pytest.mark.parametrize("name", ["embedded", "gpt2", "qwen2.5-instruct"])
def test_the_floor_never_exceeds_the_count(name: str) -> None:
    folder = default_tokenizer_path() if name == "embedded" else data_path("tokenizers", name)
    raw = (folder / "tokenizer.json").read_bytes()
    floor = token_floor(raw)
    assert floor is not None, "a byte-level BPE tokenizer has a floor"
    library = tokenizers.Tokenizer.from_str(raw.decode())
    for text in TEXTS:
        count = len(library.encode(text, add_special_tokens=False).ids)
        assert floor.tokens_at_least(text) <= count, text[:20]
        assert floor.tokens_at_least(text) >= 1


@pytest.mark.parametrize("name", ["phi-3-mini", "t5-small"])
def test_sentencepiece_and_unigram_have_none(name: str) -> None:
    raw = (data_path("tokenizers", name) / "tokenizer.json").read_bytes()
    assert token_floor(raw) is None


def _embedded_with(edit) -> bytes:  # noqa: ANN001
    spec = json.loads((default_tokenizer_path() / "tokenizer.json").read_bytes())
    edit(spec)
    return json.dumps(spec).encode()


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.update(normalizer={"type": "NFKC"}),
        lambda s: s.update(normalizer={"type": "Strip", "strip_left": True, "strip_right": True}),
        lambda s: s["pre_tokenizer"]["pretokenizers"].append({"type": "Whitespace"}),
        lambda s: s["pre_tokenizer"]["pretokenizers"].append(
            {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False}
        ),
        lambda s: s["added_tokens"][0].update(lstrip=True),
        lambda s: s["model"].update(byte_fallback=True),
        lambda s: s.update(decoder={"type": "Metaspace"}),
    ],
    ids=["nfkc", "strip", "whitespace", "split-removed", "lstrip", "byte-fallback", "decoder"],
)
def test_anything_that_can_drop_text_gives_no_floor(edit) -> None:  # noqa: ANN001
    assert token_floor(_embedded_with(edit)) is None


def test_nfc_divides_the_floor_by_three() -> None:
    plain = token_floor(_embedded_with(lambda s: None))
    nfc = token_floor(_embedded_with(lambda s: s.update(normalizer={"type": "NFC"})))
    assert plain is not None and nfc is not None
    assert nfc.divisor == 3 * plain.divisor


def test_the_transformers_backend_gets_no_floor() -> None:
    pytest.importorskip("transformers")
    tok = Tokenizer.load(default_tokenizer_path(), TokenizerOptions(backend="transformers"))
    assert tok.token_floor is None
