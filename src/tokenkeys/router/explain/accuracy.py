"""The router's accuracy as metrics: cached tokens promised against served, misses by cause.

Every forwarded request whose answer reports ``cached_tokens`` is counted per worker:

- ``tokenkeys_router_promised_cached_tokens_total{worker}``: tokens the router expected the
  worker to serve from cache (``Promise.expected_tokens``);
- ``tokenkeys_router_served_cached_tokens_total{worker}``: tokens it reported serving;
- ``tokenkeys_router_under_promises_total{worker}``: answers that served more than promised
  (the index missed blocks the worker held); over-promises are
  ``tokenkeys_router_over_promises_total`` (``router.forwarding.promise``);
- ``tokenkeys_router_misses_total{worker, cause}``: per request that did not find every full
  block of its (first) prompt at its worker, the cause of the first block missed, from what is
  known at once: ``promised_not_served`` (the answer: an over-promise), and as the request was
  routed (the answer stores the prompt's blocks, which would hide an eviction) ``evicted``
  (the worker's events removed it), ``held_elsewhere`` (another ranked worker held a longer
  prefix) and ``not_held`` (none of these; ``GET /router/explain`` tells the rest apart, at
  the cost of a key computation per recent context). A worker answering after a retry is
  judged after its answer.

The ratio to alert on: ``served / promised`` per worker over a window; it stays at 1 while the
index is true (the partial block never counts in a promise), and falls when it is stale.

The first over-promise of each worker is logged with the worker's explanation of that prompt,
and every short answer of a one-prompt request goes to the repair (``router.explain.repair``),
which resynchronises a worker whose events prove its index stale.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter

from tokenkeys.keys import KeyContext
from tokenkeys.router.explain.causes import Explainer
from tokenkeys.router.explain.repair import Repair, ShortAnswerCase
from tokenkeys.router.workers.pool import Pool
from tokenkeys.serving.labelled import Children

log = logging.getLogger(__name__)

#: The causes ``tokenkeys_router_misses_total`` counts.
MISS_CAUSES = ("promised_not_served", "evicted", "held_elsewhere", "not_held")


@dataclass(frozen=True)
class Miss:
    """A worker's miss as a request was routed (:meth:`Accuracy.miss`): the cause of its first
    full block not held (None: it holds them all) and the worker's clock of index updates then
    (``RemovalLog.tick``), from which the repair judges a short answer."""

    cause: str | None
    tick: int


class Accuracy:
    """Counts answered promises on ``registry``; tells ``explainer`` of short answers, and
    ``repair`` (when given) too."""

    def __init__(
        self, explainer: Explainer, registry: CollectorRegistry, repair: Repair | None = None
    ) -> None:
        self.explainer = explainer
        self.repair = repair
        self.promised = Counter(
            "tokenkeys_router_promised_cached_tokens",
            "Cached prompt tokens the router expected workers to serve (answered requests)",
            ["worker"],
            registry=registry,
        )
        self.served = Counter(
            "tokenkeys_router_served_cached_tokens",
            "Cached prompt tokens workers reported serving (answered forwarded requests)",
            ["worker"],
            registry=registry,
        )
        self.under_promises = Counter(
            "tokenkeys_router_under_promises",
            "Forwarded requests whose worker served more cached tokens than the router expected",
            ["worker"],
            registry=registry,
        )
        self.misses = Counter(
            "tokenkeys_router_misses",
            "Forwarded requests that missed a full block of their prompt at their worker, by "
            "the cause of the first block missed",
            ["worker", "cause"],
            registry=registry,
        )
        self._promised_of = Children(self.promised)
        self._served_of = Children(self.served)
        self._under_promises_of = Children(self.under_promises)
        self._misses_of = Children(self.misses)
        self._logged: set[str] = set()
        self._tasks: set[asyncio.Task] = set()

    def miss(self, pool: Pool, decision: Any, worker: str, prompt_tokens: int) -> Miss:
        """The :class:`Miss` of ``worker`` for ``decision``'s prompt, from what is known at
        once. Asked when the request is routed: the answer's own blocks, stored once it is
        served, must not hide an eviction."""
        removals = self.explainer.removals
        tick = removals.tick(pool.index_id(worker))
        keys = decision.keys
        held = decision.cached_blocks(worker)
        if not keys or held >= min(len(keys), max(prompt_tokens - 1, 0) // pool.block_size):
            return Miss(None, tick)
        if removals.removal(pool.index_id(worker), keys[held]):
            return Miss("evicted", tick)
        if any(s.matched_blocks > held for s in decision.ranking if s.worker != worker):
            return Miss("held_elsewhere", tick)
        return Miss("not_held", tick)

    def record(
        self,
        promise: Any,
        pool: Pool,
        ids: Sequence[int],
        context: KeyContext | None,
        decision: Any,
        missed: Miss,
    ) -> None:
        """Count one answered ``promise`` (a ``router.forwarding.promise.Promise``) of a request
        whose first prompt is ``ids``, routed by ``decision``; ``missed`` is :meth:`miss` of
        the worker that answered, as the request was routed (after its answer for a worker
        retried: its short answer is not judged, its clock being the answer's)."""
        served = promise.served_tokens
        if served is None:
            return
        worker, expected = promise.worker, promise.expected_tokens
        self._promised_of[(worker,)].inc(expected)
        self._served_of[(worker,)].inc(served)
        if served > expected:
            self._under_promises_of[(worker,)].inc()
        keys = decision.keys
        if not keys:
            return  # routed without keys (a baseline policy): nothing to explain by
        if len(promise.prompt_tokens) == 1:
            self.explainer.answered(pool.index_id(worker), keys, pool.block_size, expected, served)
            if promise.over_promised and self.repair is not None and worker == decision.worker:
                block = served // pool.block_size
                case = ShortAnswerCase.of(pool, worker, keys, block, missed.tick)
                if case is not None:
                    self.repair.short(case)
        cause = "promised_not_served" if promise.over_promised else missed.cause
        if cause is not None:
            self._misses_of[(worker, cause)].inc()
        if promise.over_promised and worker not in self._logged:
            self._logged.add(worker)
            task = asyncio.ensure_future(self._log(promise, pool, ids, context, keys))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _log(
        self,
        promise: Any,
        pool: Pool,
        ids: Sequence[int],
        context: KeyContext | None,
        keys: Sequence[int],
    ) -> None:
        try:
            found = await self.explainer.explain(pool, ids, context, only=promise.worker, keys=keys)
            part = found.worker(promise.worker)
            why = orjson.dumps(part.as_dict() if part else None).decode()
        except Exception as exc:  # a log line must not fail a request; say what failed
            why = f"(explanation failed: {exc})"
        log.warning(
            "first over-promise of worker %s (model %s): expected %d cached tokens, served %d; %s",
            promise.worker,
            pool.name,
            promise.expected_tokens,
            promise.served_tokens,
            why,
        )

    async def close(self) -> None:
        """Wait for the log lines being written."""
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
