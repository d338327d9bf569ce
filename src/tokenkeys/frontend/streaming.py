"""Server-sent events as OpenAI streams them, and text deltas from a growing id sequence."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


def sse(data: Any) -> bytes:
    """One ``data:`` event carrying ``data`` as JSON."""
    return b"data: " + orjson.dumps(data) + b"\n\n"


class IncrementalText:
    """Text deltas of a token stream whose concatenation is the decode of all its tokens.

    Each step decodes a short window: the tokens since the last emitted boundary, and the same
    window without the new tokens; the delta is the difference. The window keeps SentencePiece
    leading spaces right, and a delta ending in U+FFFD (a character whose bytes are split over
    tokens still to come) is held back until the character completes. This is the
    prefix/read-offset scheme of Hugging Face text-generation-inference and vLLM
    (``vllm/v1/engine/detokenizer.py``, slow path), written here from that description.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, new_ids: Sequence[int]) -> str:
        """Add tokens; return the text they complete (possibly empty)."""
        self.ids.extend(new_ids)
        return self._delta(final=False)

    def finish(self) -> str:
        """The text still held back, including an incomplete character."""
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        if self._read == len(self.ids):
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self._prefix = self._read
            self._read = len(self.ids)
            return after[len(before) :]
        if final:
            self._read = len(self.ids)
        return ""
