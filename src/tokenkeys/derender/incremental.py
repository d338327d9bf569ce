"""vLLM 0.32's incremental detokenization of derender, on :mod:`~tokenkeys.derender.pieces`.

The algorithm is the prefix/read-offset scheme of Hugging Face text-generation-inference that
vLLM runs (``vllm/tokenizers/detokenizer_utils.py`` ``detokenize_incrementally`` and
``convert_prompt_ids_to_tokens``; ``vllm/renderers/online_derenderer.py`` ``_detokenize_delta``
and ``_seed_stream_state``), written here from that description:

- the state is a window of pieces with two offsets; it is seeded from the last 7 prompt ids
  (read offset at its end, prefix offset 5 before), so the first output token reads in context;
- each new id adds its piece (none when it is a skipped special id, "" outside the vocabulary);
  the text of the window from the prefix offset, minus the text of the window between the two
  offsets, is the new text, unless it is not longer or ends in U+FFFD (bytes of a character
  still to come), when nothing is emitted and the offsets stay;
- after each id the window is cut to start at the prefix offset, so it stays short.

The state travels with the client between stream calls as vLLM's ``DerenderStreamState``
(``prev_tokens``, ``prefix_offset``, ``read_offset``), so either server continues the other's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenkeys.derender.pieces import Pieces

#: vLLM's ``INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET``.
OFFSET = 5


@dataclass(frozen=True)
class Window:
    """The decoding window: ``pieces`` and the prefix and read offsets into it."""

    pieces: tuple[str, ...] = ()
    prefix: int = 0
    read: int = 0


def seed(codec: Pieces, prompt_ids: Sequence[int] | None, *, skip: bool) -> Window:
    """The window after the prompt (empty without prompt ids)."""
    if not prompt_ids:
        return Window()
    pieces = codec.of(list(prompt_ids)[-OFFSET - 2 :], skip_special_tokens=skip)
    read = len(pieces)
    return Window(tuple(pieces), max(read - OFFSET, 0), read)


def _step(codec: Pieces, window: Window, token_id: int, skip: bool) -> tuple[Window, str]:
    """One id on ``window``: the window after it and the text it completes."""
    if 0 <= token_id < codec.size:
        new = codec.of([token_id], skip_special_tokens=skip)
    else:
        new = [""]
    prev = list(window.pieces)
    start = min(window.prefix, window.read, len(prev))
    shown = prev[start:] + new
    prefix_text = codec.text(shown[window.prefix - start : window.read - start])
    text = codec.text(shown[window.prefix - start :])
    grown = prev + new
    if len(text) <= len(prefix_text) or text.endswith("\ufffd"):
        prefix, read, emitted = window.prefix, window.read, ""
    else:
        prefix, read, emitted = window.read, len(prev) + len(new), text[len(prefix_text) :]
    # Cut the window to what later steps still read, and rebase the offsets onto it.
    return Window(tuple(grown[prefix:]), 0, read - prefix), emitted


def advance(
    codec: Pieces, window: Window, token_ids: Sequence[int], *, skip: bool
) -> tuple[str, Window]:
    """The text ``token_ids`` add after ``window``, and the window after them."""
    parts = []
    for token_id in token_ids:
        window, text = _step(codec, window, token_id, skip)
        parts.append(text)
    return "".join(parts), window
