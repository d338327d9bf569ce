"""Repairing a stale worker: short answers proven stale by the worker's own events, then a resync.

A worker's answer that served fewer cached tokens than the router promised is a *short
answer*; alone it proves nothing. The engine may have evicted the block after the request was
routed (its removal still on the way), or declined to read its cache for that request. A short
answer counts against the index only once the worker's events prove the index missed one:

- the first block not served (``b``) is **stored again** by the worker after the request was
  routed (the engine computed it anew, so it did not hold it), and
- between the routing and that store, **no event removed** ``b`` (on a hybrid model, no event
  removed any block: a sliding-window group's eviction shortens a hit without touching ``b``)
  and **none cleared** the worker.

An engine publishes every eviction before it can store the block again, and the router applies a
worker's events in order, so a store without a removal since the routing means the removal was
lost: the index is **stale** (the verdict ``stale``). A removal or clear since the routing
explains the answer (``explained``): the index was right, only late. A verdict needs the
store; a short answer whose block is not stored again before ``pending`` later ones of the same
worker, or whose ticks the history forgot, is dropped (``unresolved``), never counted as stale.

Once ``stale_after`` short answers of a worker, on distinct blocks, are proven stale since its
last clear, the worker is resynchronised from its engine's snapshot
(``WorkerRegistry.repair``, reason ``stale_answers``): cleared at once, so it is scored by
load alone (none of its blocks is trusted) until the snapshot rebuilt it. Two, not one:
an engine may also skip reading its cache on purpose for one kind of request (vLLM does for
``prompt_logprobs``), which stores the prompt's blocks again with no removal; a repair is
cheap, but it must answer a pattern, and the door does not promise such requests anything.

Counted in ``tokenkeys_router_short_answers_total{worker, verdict}``; the repairs in
``tokenkeys_router_worker_resyncs_total{reason="stale_answers"}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from tokenkeys.router.explain.removals import RemovalLog
from tokenkeys.router.workers.pool import Pool

#: The verdicts ``tokenkeys_router_short_answers_total`` counts.
VERDICTS = ("stale", "explained", "unresolved")
#: Short answers proven stale, on distinct blocks, that make a worker repaired.
STALE_AFTER = 2
#: Short answers of one worker awaiting their verdict at most (the oldest is dropped).
PENDING = 16

#: Asks for a worker's repair: (address, model, reason).
RepairRequest = Callable[[str, str, str], object]


@dataclass(frozen=True)
class ShortAnswerCase:
    """A short answer awaiting its verdict: the worker (address, model, index id), the first
    block not served, its key, and the worker's clock when the request was routed."""

    address: str
    model: str
    worker: str
    block: int
    key: int
    routed_tick: int
    hybrid: bool

    @classmethod
    def of(
        cls, pool: Pool, address: str, keys: Sequence[int], block: int, routed_tick: int
    ) -> ShortAnswerCase | None:
        """The case of ``address`` serving ``pool``'s prompt with block ``keys`` from ``block``
        on (None when ``block`` is no block of the prompt)."""
        if not 0 <= block < len(keys):
            return None
        worker = pool.index_id(address)
        return cls(address, pool.name, worker, block, keys[block], routed_tick, pool.layout.hybrid)


class Repair:
    """Judges short answers and asks for the repair of a worker proven stale; see the module
    doc. ``request`` starts a worker's resync (``WorkerRegistry.repair``)."""

    def __init__(
        self,
        removals: RemovalLog,
        request: RepairRequest,
        registry: CollectorRegistry,
        *,
        stale_after: int = STALE_AFTER,
        pending: int = PENDING,
    ) -> None:
        self.removals = removals
        self.request = request
        self.stale_after = stale_after
        self.pending = pending
        self.verdicts = Counter(
            "tokenkeys_router_short_answers",
            "Forwarded requests whose worker served fewer cached tokens than promised, by "
            "verdict: stale (the worker's events prove the index missed a removal), explained "
            "(an event removed the block or cleared the worker since the routing), unresolved",
            ["worker", "verdict"],
            registry=registry,
        )
        # Per index id: cases awaiting a verdict (oldest first), and blocks proven stale
        # with the tick of the proof.
        self._open: dict[str, list[ShortAnswerCase]] = {}
        self._stale: dict[str, dict[int, int]] = {}

    def short(self, case: ShortAnswerCase) -> None:
        """Judge a short answer now, or once its block is stored again (see the module doc)."""
        if self._judge(case):
            return
        worker = case.worker
        if not self.removals.await_store(worker, case.key, lambda: self._judge(case, True)):
            self.verdicts.labels(case.address, "unresolved").inc()  # its block is awaited already
            return
        cases = self._open.setdefault(worker, [])
        cases.append(case)
        while len(cases) > self.pending:
            dropped = cases.pop(0)
            self.removals.forget_awaited(worker, dropped.key)
            self.verdicts.labels(dropped.address, "unresolved").inc()

    def _judge(self, case: ShortAnswerCase, released: bool = False) -> bool:
        """Give ``case`` its verdict if its worker's events allow one; whether it got one."""
        since = self.removals.since(case.worker, case.key, case.routed_tick)
        if since.known and not (since.removed or since.cleared):
            if case.hybrid and since.any_removal:
                verdict = "explained"
            elif since.stored:
                verdict = "stale"
            elif released:  # released by a clear that came with no store: explained
                verdict = "explained"
            else:
                return False
        else:
            verdict = "explained" if since.known else "unresolved"
        if released:
            cases = self._open.get(case.worker, [])
            if case in cases:
                cases.remove(case)
        self.verdicts.labels(case.address, verdict).inc()
        if verdict == "stale":
            self._proven(case)
        return True

    def _proven(self, case: ShortAnswerCase) -> None:
        """One more block of the worker proven stale; repair it at ``stale_after``."""
        tick = self.removals.tick(case.worker)
        stale = self._stale.setdefault(case.worker, {})
        stale[case.key] = tick
        # Proofs older than the worker's last clear are void: the index was rebuilt since.
        for key, at in list(stale.items()):
            if self.removals.cleared_since(case.worker, at):
                del stale[key]
        if len(stale) >= self.stale_after:
            self._stale.pop(case.worker, None)
            self.request(case.address, case.model, "stale_answers")
