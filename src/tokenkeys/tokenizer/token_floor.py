"""A sound floor on how many tokens a text becomes, read from its UTF-8 size before encoding.

For a byte-level BPE tokenizer (GPT-2 style: ``ByteLevel`` pre-tokenizer and decoder) each
token stands for a run of input bytes, and every input byte whose symbol is in the vocabulary
ends in exactly one token (a byte missing from it is dropped, or becomes the unknown token). So
a text of ``n`` such bytes becomes at least ``ceil(n / L)`` tokens, ``L`` the longest token in
bytes (added tokens included). That lets a request certain to exceed
``max_tokens_per_text`` be refused before any encoding (a 4 Mi-character text against a
32k-token limit costs a byte count, not seconds of work).

The floor is derived only where it is certain, and is ``None`` otherwise:

- normalizers may shrink the text before it is split: none is allowed, or NFC, which shrinks a
  text's UTF-8 by at most 3 (three Hangul jamo of 3 bytes each compose into one 3-byte syllable),
  so ``L`` is multiplied by 3; any other normalizer (stripping, replacing) gives no floor;
- pre-tokenizers may drop characters (``Whitespace``, ``Split`` with ``Removed``): only
  ``ByteLevel``, ``Digits``, ``Split`` and ``Punctuation`` that keep every character are allowed;
- added tokens with ``lstrip``/``rstrip`` swallow any amount of whitespace: none may have them;
- SentencePiece-style BPE (``byte_fallback``, ``▁`` for spaces) and other models: no floor.

The rules follow the tokenizers library's own JSON (``tokenizers`` 0.23: ``pre_tokenizers``,
``normalizers``, ``models/bpe``); the byte alphabet is GPT-2's ``bytes_to_unicode``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: Normalizers allowed, with the most they can shrink a text's UTF-8 size.
_NORMALIZER_SHRINK = {None: 1, "NFC": 3}
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Digits", "Split", "Punctuation"})


def _byte_symbols() -> list[str]:
    """The symbol byte-level BPE spells each byte value with (GPT-2's bytes_to_unicode)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols = []
    shifted = 0
    for byte in range(256):
        if byte in kept:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


_BYTE_SYMBOLS = _byte_symbols()


def _pre_tokenizers(node: dict[str, Any] | None) -> list[dict[str, Any]]:
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [p for child in node.get("pretokenizers", []) for p in _pre_tokenizers(child)]
    return [node]


def _shrink(normalizer: dict[str, Any] | None) -> int | None:
    if normalizer is not None and normalizer.get("type") == "Sequence":
        parts = normalizer.get("normalizers", [])
        if len(parts) != 1:
            return None
        normalizer = parts[0]
    kind = None if normalizer is None else normalizer.get("type")
    return _NORMALIZER_SHRINK.get(kind)


@dataclass(frozen=True)
class TokenFloor:
    """At least ``ceil(bytes / (longest * shrink))`` tokens, bytes not counting ``dropped``."""

    longest: int
    shrink: int
    dropped: bytes
    """Byte values whose symbol the vocabulary lacks (the encoder drops them)."""

    @property
    def divisor(self) -> int:
        """Bytes per token at most: the floor is the counted bytes over this."""
        return self.longest * self.shrink

    def tokens_at_least(self, text: str) -> int:
        """The fewest tokens ``text`` can become (special tokens added later not counted)."""
        data = text.encode("utf-8", "surrogatepass")
        if self.dropped:
            data = data.translate(None, self.dropped)
        return -(-len(data) // self.divisor)


def token_floor(tokenizer_json: bytes | str) -> TokenFloor | None:
    """The floor of a tokenizer.json, or None where no sound floor exists."""
    try:
        spec = json.loads(tokenizer_json)
    except ValueError:
        return None
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or model.get("byte_fallback") or not isinstance(vocab, dict):
        return None
    shrink = _shrink(spec.get("normalizer"))
    if shrink is None:
        return None
    pres = _pre_tokenizers(spec.get("pre_tokenizer"))
    if not any(p.get("type") == "ByteLevel" for p in pres):
        return None
    for pre in pres:
        if pre.get("type") not in _KEEPING_PRE_TOKENIZERS or pre.get("behavior") == "Removed":
            return None
    if (spec.get("decoder") or {}).get("type") != "ByteLevel":
        return None
    added = spec.get("added_tokens") or []
    if any(a.get("lstrip") or a.get("rstrip") for a in added):
        return None
    dropped = bytes(b for b, symbol in enumerate(_BYTE_SYMBOLS) if symbol not in vocab)
    # A vocabulary token is spelled one alphabet symbol per byte.
    longest = max([len(token) for token in vocab] + [len(a["content"].encode()) for a in added])
    return TokenFloor(longest, shrink, dropped)
