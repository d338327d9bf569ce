"""Where a text may be cut so that its pieces encode independently, exactly.

The ``tokenizers`` library (read in huggingface/tokenizers 0.23: ``tokenizer/added_vocabulary.rs``
``find_matches`` and ``extract_and_normalize``, ``tokenizer/pre_tokenizer.rs``
``PreTokenizedString::split``) encodes a text in this order:

1. added tokens with ``normalized: false`` are found in the raw text by one leftmost-longest
   scan (an Aho-Corasick automaton; the scan resumes at the end of each match), then filtered
   (``single_word``; special tokens when ``split_special_tokens``) and widened (``lstrip`` back
   to the previous match at most, ``rstrip`` over the whitespace after it);
2. every piece between those matches is normalized, split on the normalized added tokens,
   pre-tokenized and run through the model *on its own* (empty pieces are dropped);
3. the post-processor adds its special tokens around the whole sequence.

So a text ``T`` cut at ``c``, the end of a step-1 match of a token ``t`` at ``[s, e)``, encodes
to ``ids(T[:c]) + ids(T[c:])`` (both without special tokens) when the scan of ``T`` and the
scans of the two parts agree around the cut. :meth:`SplicePlan.cuts` accepts a cut only when:

- no occurrence of any step-1 token overlaps the start of ``t`` or starts there and is longer
  (the ``<|`` / ``<|EOS|>`` trap): then ``t`` is a match of ``T`` and of ``T[:c]`` alike, and
  every match before it is too;
- ``c`` is where ``t``'s ``rstrip`` ends in ``T`` itself (Rust's ``\\s``, Unicode White_Space),
  and no step-1 token begins with whitespace when that strip is non-empty (the scan resumes at
  ``e``, not at ``c``);
- ``t`` is not ``single_word`` and does not begin or end with whitespace; when any step-1 token
  is ``single_word``, the character before ``c`` is ASCII and not a word character (a
  ``single_word`` token right after ``c`` reads it);
- with ``split_special_tokens`` only non-special tokens cut.

``lstrip`` of a later token is clamped at the previous match, so it never reaches across ``c``.
Which tokenizers may be cut at all (normalizers, pre-tokenizers, models and post-processors whose
steps act on each piece alone) is decided in :mod:`tokenkeys.tokenizer.splice_audit`.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Unicode White_Space: what Rust's regex ``\\s`` matches (``space_rightmost_at_start``).
RUST_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


@dataclass(frozen=True, slots=True)
class AddedTokenMatch:
    """The fields of one ``added_tokens`` entry that decide how it is matched."""

    content: str
    special: bool
    normalized: bool
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False

    @classmethod
    def from_json(cls, entry: Mapping[str, object]) -> AddedTokenMatch:
        """One entry of tokenizer.json's ``added_tokens``."""
        return cls(
            content=str(entry["content"]),
            special=bool(entry.get("special")),
            normalized=bool(entry.get("normalized")),
            lstrip=bool(entry.get("lstrip")),
            rstrip=bool(entry.get("rstrip")),
            single_word=bool(entry.get("single_word")),
        )


@dataclass(frozen=True, slots=True)
class Boundary:
    """A token after which a text may be cut, and what must not occur around it.

    ``threats`` are ``(pattern, offset)``: ``pattern`` starting ``offset`` characters before the
    token would overlap its start (or, at offset 0, be a longer match at the same start).
    """

    content: str
    rstrip: bool
    threats: tuple[tuple[str, int], ...]


def _threats(
    token: str, patterns: Sequence[str], by_char: Mapping[str, Sequence[tuple[str, int]]]
) -> tuple[tuple[str, int], ...]:
    """Patterns that would hide ``token`` (see :class:`Boundary`); ``by_char`` lists, per
    character, the patterns holding it past their first place, so that a tokenizer with
    thousands of added tokens is indexed in linear time instead of comparing every pair."""
    found = []
    # ``patterns`` is sorted: those that start with ``token`` follow it in one run.
    i = bisect.bisect_left(patterns, token)
    while i < len(patterns) and patterns[i].startswith(token):
        if len(patterns[i]) > len(token):
            found.append((patterns[i], 0))
        i += 1
    for q, off in by_char.get(token[0], ()):
        overlap = min(len(q) - off, len(token))
        if q[off : off + overlap] == token[:overlap]:
            found.append((q, off))
    return tuple(found)


def _index_by_char(patterns: Sequence[str]) -> dict[str, list[tuple[str, int]]]:
    index: dict[str, list[tuple[str, int]]] = {}
    for q in patterns:
        for off in range(1, len(q)):
            index.setdefault(q[off], []).append((q, off))
    return index


def _trie_pattern(words: Sequence[str]) -> str:
    """A regex matching the longest of ``words`` at a position, as a character trie.

    A flat alternation of thousands of tokens takes seconds to compile; the trie compiles in
    milliseconds and matches the same (greedy optional tails prefer the longer word).
    """
    trie: dict = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:
        ends = "" in node
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = "|".join(branches)
        if ends:
            return f"(?:{body})?"
        return body if len(branches) == 1 else f"(?:{body})"

    return emit(trie)


def _is_cut_word_safe(ch: str) -> bool:
    """Whether ``ch`` is surely no ``\\w`` character (checked conservatively: ASCII only)."""
    return ch.isascii() and not (ch.isalnum() or ch == "_")


@dataclass(frozen=True)
class SplicePlan:
    """How one tokenizer's texts are cut; ``prefix``/``suffix``: what ``add_special_tokens``
    adds around a single sequence (the post-processor's template)."""

    boundaries: Mapping[str, Boundary]
    space_led_pattern: bool
    single_word_tokens: bool
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    pattern: re.Pattern[str] | None

    @classmethod
    def build(
        cls,
        added: Sequence[AddedTokenMatch],
        *,
        split_special_tokens: bool,
        prefix: Sequence[int],
        suffix: Sequence[int],
    ) -> SplicePlan:
        """The plan for a tokenizer's added tokens (see the module doc for the rules)."""
        first = [a for a in added if not a.normalized]
        patterns = sorted({a.content for a in first if a.content})
        by_char = _index_by_char(patterns)
        boundaries = {
            a.content: Boundary(a.content, a.rstrip, _threats(a.content, patterns, by_char))
            for a in first
            if a.content
            and not a.single_word
            and not (split_special_tokens and a.special)
            and not a.content[0].isspace()
            and not a.content[-1].isspace()
        }
        # At one position the longest boundary token is found (the tokenizer's
        # leftmost-longest); an occurrence hidden by an overlapping earlier one is no cut
        # anyway (the earlier one threatens it).
        return cls(
            boundaries=boundaries,
            space_led_pattern=any(p[0] in RUST_WHITESPACE or p[0].isspace() for p in patterns),
            single_word_tokens=any(a.single_word for a in first),
            prefix=tuple(prefix),
            suffix=tuple(suffix),
            pattern=re.compile(_trie_pattern(list(boundaries))) if boundaries else None,
        )

    def cuts(self, text: str) -> list[int]:
        """Positions (0 < c <= len(text), increasing) where ``text`` may be cut exactly."""
        pattern = self.pattern
        if pattern is None:
            return []
        out: list[int] = []
        last = 0
        for match in pattern.finditer(text):
            s, e = match.span()
            if s < last:
                continue
            boundary = self.boundaries[match.group()]
            if any(off <= s and text.startswith(q, s - off) for q, off in boundary.threats):
                continue
            c = e
            if boundary.rstrip:
                while c < len(text) and text[c] in RUST_WHITESPACE:
                    c += 1
                if c > e and self.space_led_pattern:
                    continue
            if self.single_word_tokens and not _is_cut_word_safe(text[c - 1]):
                continue
            out.append(c)
            last = c
        return out

    def pieces(self, text: str) -> list[str]:
        """``text`` cut at every :meth:`cuts` position (one piece when there is none)."""
        starts = [0, *self.cuts(text)]
        if starts[-1] == len(text) and len(starts) > 1:
            starts.pop()
        ends = starts[1:] + [len(text)]
        return [text[a:b] for a, b in zip(starts, ends, strict=True)]
