"""Tokenizers built at test time to break incremental tokenization caches.

Each is trained here (the ``tokenizers`` library's BPE or Unigram trainer on a small corpus) and
written as a folder with a ChatML template, so nothing is downloaded. The cases are the traps
other caches fell into: overlapping special tokens (``<|`` beside ``<|EOS|>``, Dynamo's), BOS
and EOS from the post-processor (SMG's re-added BOS), added tokens with ``lstrip``/``rstrip``/
``single_word``/``normalized``, NFKC and lowercase normalizers, SentencePiece's prepend (legacy)
and Metaspace ``prepend_scheme`` first (non-legacy), byte fallback, digit and whitespace
splitting.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. 12345 67890 3.14159",
    "naïve café ﬁn Ｆｕｌｌ ① Straße İstanbul e\u0301 Ελληνικά 日本語 😀 tab\tnew\r\nline",
    "def f(x):\n    return x  *  2  # comment\n\n\nclass A: pass",
    "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>",
] * 20
CHAT_SPECIALS = ["<|im_start|>", "<|im_end|>", "<s>", "</s>"]


def _byte_level() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=CHAT_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _bos_eos(tok: Tokenizer) -> None:
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", bos), ("</s>", eos)],
    )


def overlapping_specials() -> Tokenizer:
    """``<|`` and ``|>`` and ``<|EOS|>`` and ``<|EOS|>x`` all added; BOS and EOS around."""
    tok = _byte_level()
    tok.add_special_tokens(["<|EOS|>", "<|", "|>", "<|EOS|>x", "EOS"])
    tok.add_tokens([AddedToken("S|", normalized=False)])
    _bos_eos(tok)
    return tok


def strip_flags() -> Tokenizer:
    """Added tokens with lstrip, rstrip, single_word, and normalized ones, NFKC + lowercase."""
    tok = _byte_level()
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.add_special_tokens(
        [
            AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False, special=True),
            AddedToken("<end>", rstrip=True, normalized=False, special=True),
            AddedToken("<start>", lstrip=True, normalized=False, special=True),
        ]
    )
    tok.add_tokens(
        [
            AddedToken("word", single_word=True, normalized=False),
            AddedToken("fox", normalized=True),
            AddedToken(" spaced", normalized=False),
        ]
    )
    _bos_eos(tok)
    return tok


def sentencepiece_legacy() -> Tokenizer:
    """Llama-2 style: Prepend("▁") + Replace normalizer, byte-fallback BPE, BOS only."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<unk>", *CHAT_SPECIALS, *byte_tokens],
        limit_alphabet=40,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B:1", special_tokens=[("<s>", bos)]
    )
    return tok


def _metaspace(scheme: str) -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Metaspace(prepend_scheme=scheme),
        ]
    )
    tok.decoder = decoders.Metaspace(prepend_scheme=scheme)
    trainer = trainers.UnigramTrainer(
        vocab_size=300,
        special_tokens=["<unk>", *CHAT_SPECIALS],
        unk_token="<unk>",
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    _bos_eos(tok)
    return tok


def metaspace_always() -> Tokenizer:
    """Unigram behind WhitespaceSplit, single digits and Metaspace prepending to every word."""
    return _metaspace("always")


def metaspace_first() -> Tokenizer:
    """Metaspace prepending only at the start of the whole text: no cut is independent."""
    return _metaspace("first")


BUILT: dict[str, Callable[[], Tokenizer]] = {
    "overlapping-specials": overlapping_specials,
    "strip-flags": strip_flags,
    "sentencepiece-legacy": sentencepiece_legacy,
    "metaspace-always": metaspace_always,
    "metaspace-first": metaspace_first,
}


def write_folder(name: str, root: Path) -> Path:
    """Train the named tokenizer and write it as a folder under ``root``; its path."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    BUILT[name]().save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
