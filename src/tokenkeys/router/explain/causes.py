"""One prompt's explanation, per worker: blocks held, and why the first block not held is not.

The causes, each from what this router saw (the index, the removals its events made, the
promises it checked, the registry's refusals), tried in this order for each worker:

- ``renders_differently``: the worker serves the model with another tokenizer fingerprint
  (another chat template, tokenizer revision or option) than the pool's, so it was refused:
  its prompts are other token ids, its blocks other keys;
- ``refused`` / ``down``: the worker is not routed to for another refusal, or is down (its
  entries were cleared);
- ``promised_not_served``: the last request answered by the worker that shared this prefix
  was promised a block (the index held it) that the worker did not serve, and no event stored
  that block since: the index is stale;
- ``evicted``: the worker's events removed the block (the batch's sequence number and times);
- ``other_context``: the worker holds the same tokens keyed with another key context this
  router routed recently (another ``cache_salt``, or none); the other salt is never shown;
- ``held_elsewhere``: another worker of the pool holds the block;
- ``never_stored``: no event of the worker stored it since this router followed it (or since
  its last clear, given in ``since``). Keys forgotten by the index's own capacity (memory
  backend, LRU) read as never stored too: the index does not say which keys it dropped.

A worker holding every full block of the prompt has no cause. Only the prompt's full blocks
count; the engine always computes the last token, so a promise never covers it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenkeys.keys import KeyContext
from tokenkeys.router.explain.removals import RemovalLog
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.workers.pool import Pool
from tokenkeys.router.workers.state import WorkerState

#: The causes, in the order they are tried (the module doc).
CAUSES = (
    "renders_differently",
    "refused",
    "down",
    "promised_not_served",
    "evicted",
    "other_context",
    "held_elsewhere",
    "never_stored",
)
#: Distinct key contexts remembered per pool for ``other_context`` (each costs one key
#: computation and one lookup per explained worker).
CONTEXTS_KEPT = 8


@dataclass(frozen=True)
class WorkerExplanation:
    """One worker's part of an explanation; ``first_missing_block`` and ``cause`` are None when
    it holds every full block of the prompt."""

    worker: str
    state: str
    held_blocks: int
    first_missing_block: int | None
    cause: str | None
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {
            "worker": self.worker,
            "state": self.state,
            "held_blocks": self.held_blocks,
            "first_missing_block": self.first_missing_block,
            "cause": self.cause,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Explanation:
    """A prompt's explanation: its model, block size, full blocks, and every worker's part."""

    model: str
    block_size: int
    prompt_tokens: int
    prompt_blocks: int
    workers: tuple[WorkerExplanation, ...]

    def worker(self, address: str) -> WorkerExplanation | None:
        """The part of ``address``."""
        return next((w for w in self.workers if w.worker == address), None)

    def as_dict(self) -> dict[str, Any]:
        """As JSON (``GET /router/explain``)."""
        return {
            "model": self.model,
            "block_size": self.block_size,
            "prompt_tokens": self.prompt_tokens,
            "prompt_blocks": self.prompt_blocks,
            "workers": [w.as_dict() for w in self.workers],
        }


@dataclass(frozen=True)
class ShortAnswer:
    """A worker's answer that served fewer cached blocks than promised: the prompt's keys up to
    the first block not served, and the numbers."""

    keys: tuple[int, ...]
    expected_tokens: int
    served_tokens: int
    at: float

    @property
    def block(self) -> int:
        """The first block promised and not served."""
        return len(self.keys) - 1


def mark_dict(mark: Any) -> dict[str, Any]:
    """A :class:`~tokenkeys.router.ingest.ingestor.BatchMark` as JSON."""
    return {"seq": mark.seq, "engine_ts": mark.engine_ts, "applied_at": mark.applied_at}


class Explainer:
    """Explains prompts over a registry's pools and workers; see the module doc.

    ``removals`` is the index wrapper recording removals (:class:`RemovalLog`); it must wrap
    the index the workers' events are applied to. ``workers`` is the registry's view
    (address -> :class:`WorkerState`), read, never changed.
    """

    def __init__(
        self, index: PrefixIndex, removals: RemovalLog, workers: dict[str, WorkerState]
    ) -> None:
        self.index = index
        self.removals = removals
        self.workers = workers
        self._contexts: dict[str, OrderedDict[KeyContext | None, None]] = {}
        self._short: dict[str, ShortAnswer] = {}

    # --- what the front door tells it ----------------------------------------------------

    def routed(self, pool: Pool, context: KeyContext | None) -> None:
        """A request of ``pool`` was routed with ``context`` (remembered, bounded)."""
        seen = self._contexts.setdefault(pool.name, OrderedDict())
        seen[context] = None
        seen.move_to_end(context)
        while len(seen) > CONTEXTS_KEPT:
            seen.popitem(last=False)

    def answered(
        self, worker_id: str, keys: Sequence[int], block_size: int, expected: int, served: int
    ) -> None:
        """An answer of ``worker_id`` (index id) to a one-prompt request with block ``keys``:
        a short one is remembered (one per worker); one that served what was promised past
        the remembered block forgets it."""
        if served < expected:
            block = served // block_size
            if block < len(keys):
                self._short[worker_id] = ShortAnswer(
                    tuple(keys[: block + 1]), expected, served, time.time()
                )
                self.removals.watch(worker_id, keys[block])
            return
        short = self._short.get(worker_id)
        if short is not None and served >= (short.block + 1) * block_size:
            if tuple(keys[: short.block + 1]) == short.keys:
                del self._short[worker_id]

    def short_answer(self, worker_id: str) -> ShortAnswer | None:
        """The last short answer of ``worker_id`` still standing, if any."""
        short = self._short.get(worker_id)
        if short is None or not self.removals.watching(worker_id, short.keys[-1]):
            return None  # stored again, or the worker was cleared since: no longer stale
        return short

    # --- explaining ------------------------------------------------------------------------

    async def explain(
        self,
        pool: Pool,
        ids: Sequence[int],
        context: KeyContext | None,
        *,
        only: str | None = None,
        keys: Sequence[int] | None = None,
    ) -> Explanation:
        """The explanation of prompt ``ids`` with ``context`` in ``pool`` (``only``: of that
        worker address alone; ``keys``: the prompt's block keys when already computed)."""
        if keys is None:
            keys = await pool.block_keys(ids, context)
        members = {pool.index_id(a): a for a in pool.members if only in (None, a)}
        runs = await self.index.lookup(keys, frozenset(members)) if keys and members else {}
        parts = []
        for address, ws in self.workers.items():
            if only not in (None, address):
                continue
            if address in pool.members:
                held = runs[pool.index_id(address)].blocks if pool.index_id(address) in runs else 0
                parts.append(await self._member(pool, address, ids, keys, context, held))
            else:
                part = _outside(pool, ws)
                if part is not None:
                    parts.append(part)
        return Explanation(pool.name, pool.block_size, len(ids), len(keys), tuple(parts))

    async def _member(
        self,
        pool: Pool,
        address: str,
        ids: Sequence[int],
        keys: Sequence[int],
        context: KeyContext | None,
        held: int,
    ) -> WorkerExplanation:
        worker = pool.index_id(address)

        def part(block: int, cause: str | None, **detail: Any) -> WorkerExplanation:
            return WorkerExplanation(address, "ready", held, block, cause, detail)

        short = self.short_answer(worker)
        prefix = tuple(keys[: short.block + 1]) if short is not None else ()
        if short is not None and short.block < held and prefix == short.keys:
            return part(
                short.block,
                "promised_not_served",
                expected_tokens=short.expected_tokens,
                served_tokens=short.served_tokens,
                at=short.at,
            )
        if held >= len(keys):
            return WorkerExplanation(address, "ready", held, None, None)
        key = keys[held]
        removal = self.removals.removal(worker, key)
        if removal is not None:
            return part(held, "evicted", tier=removal.tier, **mark_dict(removal.mark))
        other = await self._other_context(pool, worker, ids, context, held)
        if other is not None:
            return part(held, "other_context", **other)
        others = {pool.index_id(a): a for a in pool.members if a != address}
        holders = await self.index.lookup(keys[held:], frozenset(others)) if others else {}
        if holders:
            return part(held, "held_elsewhere", workers=sorted(others[w] for w in holders))
        cleared = self.removals.cleared(worker)
        return part(held, "never_stored", since=mark_dict(cleared) if cleared else None)

    async def _other_context(
        self,
        pool: Pool,
        worker: str,
        ids: Sequence[int],
        context: KeyContext | None,
        held: int,
    ) -> dict[str, Any] | None:
        """What differs in the first recent context under which ``worker`` holds block
        ``held`` of the same tokens, or None."""
        tried = list(self._contexts.get(pool.name, ()))
        if context is not None and None not in tried:
            tried.append(None)
        for other in tried:
            if other == context:
                continue
            keys = await pool.block_keys(ids, other)
            found = await self.index.lookup(keys, [worker])
            if worker in found and found[worker].blocks > held:
                return _difference(context, other)
        return None


def _difference(mine: KeyContext | None, other: KeyContext | None) -> dict[str, Any]:
    """How ``other`` differs from ``mine``, naming no other tenant's salt."""
    mine, other = mine or KeyContext(), other or KeyContext()
    out: dict[str, Any] = {}
    if mine.cache_salt != other.cache_salt:
        out["cache_salt"] = "none" if other.cache_salt is None else "another"
    if mine.adapter != other.adapter:
        out["adapter"] = other.adapter.name if other.adapter is not None else None
    return out


def _outside(pool: Pool, ws: WorkerState) -> WorkerExplanation | None:
    """The part of a worker that describes ``pool``'s model but is not a member, or None."""
    served = ws.description.model(pool.name) if ws.description is not None else None
    if served is None:
        return None
    if ws.state == "down":
        return WorkerExplanation(ws.address, "down", 0, 0, "down", {"error": ws.error})
    refusal = next((r for r in ws.refusals if r.model == pool.name), None)
    if refusal is not None and refusal.reason == "tokenizer_fingerprint":
        detail = {"worker_fingerprint": served.fingerprint, "router_fingerprint": pool.fingerprint}
        return WorkerExplanation(ws.address, "refused", 0, 0, "renders_differently", detail)
    detail = {"reason": refusal.reason, "message": refusal.message} if refusal else {}
    return WorkerExplanation(ws.address, ws.state, 0, 0, "refused", detail)
