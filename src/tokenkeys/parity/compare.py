"""One shape on both sides: certified, or the first differing token, its context and a likely cause.

The cause is a heuristic, always reported as "likely": a differing first token where one side has
BOS (a BOS rule); one side the other's prefix (the end: a generation prompt, or EOS); the same
text tokenized differently (backend, special-token splitting); text equal but for whitespace;
a difference in the first tokens (the template's prologue); else the template's rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenkeys.errors import TokenkeysError
from tokenkeys.parity.corpus import Shape
from tokenkeys.parity.engine import EngineError, LiveEngine
from tokenkeys.parity.local import conversion, served_ids
from tokenkeys.preprocess.preprocessor import Preprocessor

#: Tokens shown either side of the first difference.
CONTEXT = 3
#: A difference this early is read as the template's prologue.
PROLOGUE_TOKENS = 16


@dataclass
class Result:
    """The verdict on one shape (``status``: certified, differs, error or unverified)."""

    name: str
    route: str
    status: str
    source: str = ""
    tokens: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "route": self.route,
            "status": self.status,
            "source": self.source,
            "tokens": self.tokens,
            **self.detail,
        }


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (one ending counts), else None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def likely_cause(pre: Preprocessor, engine: list[int], ours: list[int], index: int) -> str:
    """A heuristic label for the difference at ``index`` (see the module doc)."""
    tok = pre.tokenizer
    specials = tok.specials
    bos = specials.bos.id if specials.bos is not None else None
    eos = {e.id for e in specials.eos}
    if index == 0 and bos is not None and (engine[:1] == [bos]) != (ours[:1] == [bos]):
        return "likely: a BOS difference (one side adds BOS at the start)"
    if index == min(len(engine), len(ours)):
        tail = (engine if len(engine) > len(ours) else ours)[index:]
        side = "the engine" if len(engine) > len(ours) else "tokenkeys"
        if set(tail) <= eos:
            return f"likely: an EOS difference ({side} ends with EOS)"
        return f"likely: the generation prompt at the end ({side} has {len(tail)} more tokens)"
    text_engine, text_ours = pre.detokenize([engine, ours])
    if text_engine == text_ours:
        return "likely: the same text tokenized differently (tokenizer backend or special tokens)"
    if "".join(text_engine.split()) == "".join(text_ours.split()):
        return "likely: whitespace (the texts differ only in spaces or newlines)"
    if index < PROLOGUE_TOKENS:
        return "likely: the template prologue (a default system prompt or header)"
    return "likely: the chat template (the conversation renders differently)"


def _context(pre: Preprocessor, ids: list[int], index: int) -> dict[str, Any]:
    start = max(0, index - CONTEXT)
    window = ids[start : index + CONTEXT + 1]
    return {
        "from": start,
        "ids": window,
        "text": pre.tokenizer.token_strs(window, "decoded") if window else [],
    }


def check(pre: Preprocessor, engine: LiveEngine, shape: Shape, model: str) -> Result:
    """Render ``shape`` on the engine and on ``pre``, and compare the ids."""
    body = {**shape.body, "model": model}
    try:
        fetched = engine.ids(shape.route, body, conversion(pre, shape.route, body))
    except (EngineError, TokenkeysError) as exc:
        return Result(shape.name, shape.route, "error", detail={"error": str(exc)})
    if fetched.ids is None:
        return Result(shape.name, shape.route, "unverified", fetched.source)
    try:
        ours = served_ids(pre, shape.route, body)
    except TokenkeysError as exc:
        detail = {"error": f"tokenkeys refused it: {exc.message}"}
        return Result(shape.name, shape.route, "error", fetched.source, detail=detail)
    total = sum(len(p) for p in fetched.ids)
    try:
        pre.tokenizer.check_ids(fetched.ids, field="token_ids")
    except TokenkeysError as exc:
        detail = {"error": exc.message, "likely_cause": "likely: another tokenizer"}
        return Result(shape.name, shape.route, "differs", fetched.source, total, detail)
    if len(ours) != len(fetched.ids):
        detail = {"error": f"the engine rendered {len(fetched.ids)} prompts, tokenkeys {len(ours)}"}
        return Result(shape.name, shape.route, "differs", fetched.source, total, detail)
    for n, (theirs, mine) in enumerate(zip(fetched.ids, ours, strict=True)):
        index = first_difference(theirs, mine)
        if index is None:
            continue
        detail = {
            "prompt": n,
            "index": index,
            "engine": _context(pre, theirs, index),
            "tokenkeys": _context(pre, mine, index),
            "engine_tokens": len(theirs),
            "tokenkeys_tokens": len(mine),
            "likely_cause": likely_cause(pre, theirs, mine, index),
        }
        return Result(shape.name, shape.route, "differs", fetched.source, total, detail)
    # The template renders alike; the engine's own conversion must count the same.
    if fetched.count is not None and fetched.count != len(ours[0]):
        detail = {
            "error": f"the engine counts {fetched.count} prompt tokens for the request as sent, "
            f"tokenkeys renders {len(ours[0])}",
            "engine_tokens": fetched.count,
            "tokenkeys_tokens": len(ours[0]),
            "likely_cause": f"likely: the {shape.route} conversion (the engine converts the "
            "request into another conversation)",
        }
        return Result(shape.name, shape.route, "differs", fetched.source, total, detail)
    return Result(shape.name, shape.route, "certified", fetched.source, total)
