"""Output logprobs of a token-out answer resolved to token strings, as vLLM 0.32's derender does.

The engine sends each position's sampled id and its top ids with their logprobs, and no text;
derender spells them (``renderers/online_derenderer.py`` ``_resolve_logprobs``,
``_correct_decoded_token``, ``_convert_chat_logprobs_to_completion_logprobs``;
``entrypoints/generate/base/serving.py`` ``decode_token_ids``; written here from them):

- each id is decoded alone (its bytes the UTF-8 of that text); an id without a vocabulary piece
  is ``""`` with no bytes; on a tokenizer whose pre-tokenizer is Metaspace, the leading spaces
  the decode strips are put back from the piece's markers;
- a text ending in U+FFFD (a character whose bytes continue in the next tokens) is decoded again
  after up to four of the sampled ids before it, and what that adds past their clean prefix is
  the token's text;
- a completion's logprobs are the same entries as flat lists, with each token's character
  offset in the output text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tokenkeys.derender.pieces import Pieces

_FFFD = "\ufffd"
#: How many sampled ids before a token give it context (vLLM's ``_LOGPROB_CONTEXT_WINDOW``).
CONTEXT = 4

Decode = Callable[[Sequence[int]], str]


class Speller:
    """Token ids spelled alone, on a model's decode and pieces."""

    def __init__(self, decode: Decode, codec: Pieces) -> None:
        self._decode = decode
        #: The model's pieces (the detokenization of the text uses them too).
        self.codec = codec
        self._marker = codec.marker

    def spell(self, ids: Sequence[int]) -> list[tuple[str, list[int] | None]]:
        """Each id's text and bytes (``decode_token_ids``)."""
        pieces = [self.codec.piece(i) for i in ids]
        out: list[tuple[str, list[int] | None]] = []
        for token_id, piece in zip(ids, pieces, strict=True):
            if piece is None:
                out.append(("", None))
                continue
            text = self._decode([token_id]) or ""
            if self._marker is not None:
                text = _restore_spaces(piece, text, self._marker)
            out.append((text, list(text.encode("utf-8", errors="replace"))))
        return out

    def corrected(self, token_id: int, context: Sequence[int]) -> str:
        """The text of a token that decodes alone to a partial character, read after up to
        :data:`CONTEXT` sampled ids (``_correct_decoded_token``); "" when none completes it."""
        for n in range(1, min(len(context), CONTEXT) + 1):
            window = list(context[-n:])
            full = self._decode([*window, token_id])
            if full.endswith(_FFFD):
                continue
            clean = len(window)
            for j in range(len(window) - 1, -1, -1):
                if not self._decode([window[j]]).endswith(_FFFD):
                    break
                clean = j
            prefix = self._decode(window[:clean]) if clean > 0 else ""
            if full.startswith(prefix):
                return full[len(prefix) :]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""


def _restore_spaces(piece: str, text: str, marker: str) -> str:
    markers = len(piece) - len(piece.lstrip(marker))
    if markers == 0:
        return text
    missing = markers - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


def chat_logprobs(
    speller: Speller, logprobs: dict[str, Any], context: Sequence[int] = ()
) -> dict[str, Any]:
    """A chat choice's ``logprobs`` from the engine's (``_resolve_logprobs``)."""
    content = logprobs.get("content")
    if content is None:
        return {"content": None}
    seen = list(context)
    out = []
    for entry in content:
        tops = entry.get("top_logprobs") or []
        (text, data), *spelled_tops = speller.spell(
            [entry["token_id"], *(t["token_id"] for t in tops)]
        )
        if text.endswith(_FFFD):
            text = speller.corrected(entry["token_id"], seen)
            data = list(text.encode("utf-8"))
        resolved = []
        for top, (top_text, top_data) in zip(tops, spelled_tops, strict=True):
            if top_text.endswith(_FFFD):
                top_text = speller.corrected(top["token_id"], seen)
                top_data = list(top_text.encode("utf-8"))
            resolved.append(
                {"token": top_text, "logprob": float(top["logprob"]), "bytes": top_data}
            )
        out.append(
            {
                "token": text,
                "logprob": float(entry["logprob"]),
                "bytes": data,
                "top_logprobs": resolved,
            }
        )
        seen.append(entry["token_id"])
    return {"content": out}


def completion_logprobs(chat: dict[str, Any], offset: int = 0) -> dict[str, Any]:
    """A completion choice's flat ``logprobs`` from the chat form, offsets from ``offset``."""
    flat: dict[str, list[Any]] = {
        "text_offset": [],
        "token_logprobs": [],
        "tokens": [],
        "top_logprobs": [],
    }
    for entry in chat["content"] or []:
        flat["text_offset"].append(offset)
        flat["tokens"].append(entry["token"])
        flat["token_logprobs"].append(entry["logprob"])
        tops = entry["top_logprobs"]
        flat["top_logprobs"].append({t["token"]: t["logprob"] for t in tops} if tops else None)
        offset += len(entry["token"])
    return flat
