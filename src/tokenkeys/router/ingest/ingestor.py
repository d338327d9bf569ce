"""Applying decoded KV-event batches to a prefix index, per worker and in order.

Rules (llm-d's ``kvevents/pool.go`` ``processEventBatch``, llm-d-router ``ebab687``, and the
vLLM router checklist in ../shared/reference/engines/vllm.md §8):

- ``BlockStored`` adds its hashes for the worker on the tier of its ``medium`` (None = "gpu");
  ``BlockRemoved`` removes them from that tier; ``AllBlocksCleared`` clears the worker.
- A publisher restart (its sequence went back) or batches lost for good (neither received nor
  replayable) clear the worker first: what the index said about it can no longer be trusted,
  and an index that under-reports only costs cache hits, while one that over-reports routes to
  a worker that lost the prefix.
- A batch whose ``spec`` (cache-key profile and spec fingerprint) is not the pool's is never
  indexed: its hashes follow keys this router does not compute. Its events are counted.
- With ``group_idx`` set (the routing group: full attention), events of that group are indexed
  under their hashes. With a ``layout`` (hybrid models), the sliding-window groups it names are
  indexed too, each under keys of its own (``index.hybrid.group_key``: vLLM publishes one hash
  per block in every group that stores it, and a window group's removal must not drop the full
  attention block), so routing can tell how far the engine resumes a prefix. Events of other
  groups are skipped, and so are stores of kinds that are not prefix-reusable attention (as
  llm-d's ``blockStoredEventDigestible`` does) unless the layout names their group.

Consecutive events of the same kind and tier are coalesced into one index call (vLLM sends one
``BlockRemoved`` per hash); order between different kinds is kept.

Callers apply one worker's batches one at a time (one consumer task per worker); different
workers may be applied concurrently.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from tokenkeys.errors import InvalidArgument, TokenkeysError
from tokenkeys.events.model import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    SpecRef,
)
from tokenkeys.router.index.hybrid import GroupLayout, group_key
from tokenkeys.router.index.model import PrefixIndex, check_worker, index_keys, medium_tier
from tokenkeys.router.ingest.backoff import WriteBackoff
from tokenkeys.serving.labelled import Children

log = logging.getLogger(__name__)

#: ``kv_cache_spec_kind`` values whose blocks a later request reuses by prefix (llm-d-router
#: ``pool.go``); stores of other kinds (sliding_window, mamba, ...) are not indexed.
PREFIX_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})

#: The operation of every ``AllBlocksCleared`` (see ``EventIngestor._operation``).
_CLEAR = ("clear", "", (), None)


@dataclass(frozen=True)
class BatchMark:
    """Where the index update being applied comes from: a worker's batch, its sequence number
    (None when the transport gives none), the engine's timestamp and when it was applied here.
    """

    worker: str
    seq: int | None
    engine_ts: float | None
    applied_at: float


#: The batch whose events are being applied, set by :meth:`EventIngestor.apply` for the index
#: calls it makes (one task applies one worker's batch), so that what wraps the index (the
#: removals kept for explanations, ``router.explain.removals``) knows which event removed a
#: key without the index Protocol carrying it.
applying: ContextVar[BatchMark | None] = ContextVar("tokenkeys_applying_batch", default=None)


class IngestMetrics:
    """Prometheus counters of ingestion, labelled by worker.

    - ``tokenkeys_router_kv_batches_total{outcome}``: ``applied``, ``ignored`` (foreign spec),
      ``undecodable``, ``failed`` (index error), ``dropped`` (skipped while the index is down);
    - ``tokenkeys_router_kv_events_total{type}``: events applied, by event type;
    - ``tokenkeys_router_kv_events_ignored_total{reason}``: events not indexed: ``foreign_spec``,
      ``no_spec``, ``other_group``, ``not_prefix_kind``, ``bad_medium``;
    - ``tokenkeys_router_worker_clears_total{reason}``: ``all_blocks_cleared``,
      ``publisher_restart``, ``events_lost``, ``undecodable``, ``index_write_failed`` (a
      write failed, e.g. Redis full: see ``backoff``), ``index_recovered``; and from
      the worker registry ``worker_joined``, ``worker_down``, ``worker_restarted``,
      ``worker_refused``;
    - ``tokenkeys_router_worker_resyncs_total{reason, source}``: workers resynchronised on
      request (``workers.following.EventFollowing.resync``): cleared (counted above under
      ``resync``), then rebuilt from the engine's ``snapshot``, or from its ``replay`` buffer
      when the engine offers no snapshot.

    ``registry`` defaults to a private one (see :attr:`registry`). Increment per batch through
    the ``*_counts`` children (``batch_counts[worker, "applied"]``) rather than ``labels()``;
    both reach the same child.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.batches = Counter(
            "tokenkeys_router_kv_batches",
            "KV-event batches by outcome.",
            ("worker", "outcome"),
            registry=self.registry,
        )
        self.events = Counter(
            "tokenkeys_router_kv_events",
            "KV events applied to the prefix index, by type.",
            ("worker", "type"),
            registry=self.registry,
        )
        self.ignored = Counter(
            "tokenkeys_router_kv_events_ignored",
            "KV events not indexed, by reason.",
            ("worker", "reason"),
            registry=self.registry,
        )
        self.clears = Counter(
            "tokenkeys_router_worker_clears",
            "Workers cleared from the prefix index, by reason.",
            ("worker", "reason"),
            registry=self.registry,
        )
        self.resyncs = Counter(
            "tokenkeys_router_worker_resyncs",
            "Workers resynchronised on request, by reason and by what rebuilt them.",
            ("worker", "reason", "source"),
            registry=self.registry,
        )
        #: The counters' children by ``(worker, label)``, for the increments made per batch.
        self.batch_counts = Children(self.batches)
        self.event_counts = Children(self.events)
        self.ignored_counts = Children(self.ignored)
        self.clear_counts = Children(self.clears)


class EventIngestor:
    """Applies a pool's KV-event batches to ``index``; ``spec`` is the pool's expected spec.

    One ingestor serves every worker of a pool. See the module docstring for the rules.
    """

    def __init__(
        self,
        index: PrefixIndex,
        spec: SpecRef,
        *,
        group_idx: int | None = None,
        layout: GroupLayout | None = None,
        metrics: IngestMetrics | None = None,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        if not isinstance(spec, SpecRef):
            raise InvalidArgument(
                f"spec must be a SpecRef (profile id, spec fingerprint), got {type(spec).__name__}",
                field="spec",
            )
        self.index = index
        self.spec = spec
        self.group_idx = layout.routing_group if layout is not None else group_idx
        #: Sliding-window groups indexed under keys of their own.
        self.windows = frozenset(w.index for w in layout.windows) if layout is not None else ()
        self.metrics = metrics if metrics is not None else IngestMetrics()
        #: Told the worker whose batches were lost for good, once it was cleared (the worker
        #: registry rebuilds it from its engine's snapshot: ``WorkerRegistry.repair``).
        self.on_lost = on_lost

    async def reset(self, worker: str, reason: str) -> None:
        """Clear ``worker`` from the index and count it under ``reason``."""
        check_worker(worker)
        await self.index.clear(worker)
        self.metrics.clear_counts[worker, reason].inc()
        log.info("prefix index: cleared worker %s (%s)", worker, reason)

    async def write_failed(self, worker: str, backoff: WriteBackoff, error: str) -> bool:
        """A write of ``worker``'s entries failed: back off, and clear it once now.

        Returns whether the clear succeeded (a full Redis still deletes; a Redis that is down
        does not, and the rebuild then clears first). See ``backoff`` for why not at once.
        """
        backoff.failed(error)
        log.warning(
            "prefix index write failed for %s, routing it by load for %.1f s: %s",
            worker,
            backoff.delay,
            error,
        )
        try:
            await self.reset(worker, "index_write_failed")
        except TokenkeysError:
            return False
        return True

    async def apply(
        self,
        worker: str,
        batch: EventBatch,
        *,
        restarted: bool = False,
        lost_before: int = 0,
        seq: int | None = None,
    ) -> bool:
        """Apply one batch of ``worker``'s events; False when the batch was ignored.

        ``restarted`` and ``lost_before`` come from the transport (a
        :class:`~tokenkeys.events.zmq_subscriber.Delivery`): either clears the worker first.
        ``seq`` is the batch's sequence number, marked on the index calls (:data:`applying`).
        Index errors propagate (the index may then hold part of the batch; the caller resets
        the worker once the index is back).
        """
        check_worker(worker)
        mark = applying.set(BatchMark(worker, seq, batch.ts, time.time()))
        try:
            return await self._apply(worker, batch, restarted, lost_before)
        finally:
            applying.reset(mark)

    async def _apply(
        self, worker: str, batch: EventBatch, restarted: bool, lost_before: int
    ) -> bool:
        if restarted:
            await self.reset(worker, "publisher_restart")
        elif lost_before > 0:
            await self.reset(worker, "events_lost")
            if self.on_lost is not None:
                self.on_lost(worker)
        spec = batch.spec
        if spec is not self.spec and spec != self.spec:  # `is`: the same object is equal
            reason = "no_spec" if spec is None else "foreign_spec"
            if batch.events:
                self.metrics.ignored_counts[worker, reason].inc(len(batch.events))
            self.metrics.batch_counts[worker, "ignored"].inc()
            log.debug(
                "ignoring a KV-event batch of %s: spec %s, expected %s",
                worker,
                spec,
                self.spec,
            )
            return False
        try:
            applied = await self._apply_events(worker, batch.events)
        except TokenkeysError:
            self.metrics.batch_counts[worker, "failed"].inc()
            raise
        counts = self.metrics.event_counts
        for kind, count in applied.items():
            counts[worker, kind].inc(count)
        self.metrics.batch_counts[worker, "applied"].inc()
        return True

    async def _apply_events(self, worker: str, events: tuple[KvEvent, ...]) -> dict[str, int]:
        """Apply events in order, coalescing runs of one kind and tier into one index call."""
        applied: dict[str, int] = {}
        # The operation and tier of the keys collected so far (the run not yet written).
        run: str | None = None
        run_tier = ""
        keys: list[int] = []
        for event in events:
            op = self._operation(worker, event)
            if op is None:
                continue
            kind, tier, hashes, group = op
            name = type(event).__name__
            applied[name] = applied.get(name, 0) + 1
            if keys and (kind != run or tier != run_tier):
                await self._flush(worker, run, run_tier, keys)
                keys = []
            if kind == "clear":
                await self.reset(worker, "all_blocks_cleared")
                run = None
                continue
            run, run_tier = kind, tier
            if group is not None:
                routing = self.group_idx
                keys.extend(group_key(k, group, routing) for k in index_keys(hashes))
            elif keys:
                keys.extend(index_keys(hashes))
            else:  # index_keys returns a new list: the run's first event needs no copy
                keys = index_keys(hashes)
        if keys:
            await self._flush(worker, run, run_tier, keys)
        return applied

    def _flush(self, worker: str, kind: str | None, tier: str, keys: list[int]) -> Awaitable[None]:
        """The index call writing a run (a coroutine to await; no frame of its own)."""
        if kind == "add":
            return self.index.add(worker, keys, tier)
        return self.index.remove(worker, keys, tier)

    def _operation(self, worker: str, event: KvEvent) -> tuple[str, str, tuple, int | None] | None:
        """(index operation, tier, hashes, window group or None) for one event, or None when it
        is skipped."""
        # `type(...) is` first: a BlockStored is no AllBlocksCleared, and the exact class, by far
        # the most common event, needs no isinstance walk.
        stored = type(event) is BlockStored
        if not stored and isinstance(event, AllBlocksCleared):
            return _CLEAR
        window = event.group_idx if event.group_idx in self.windows else None
        if (
            window is None
            and self.group_idx is not None
            and event.group_idx not in (None, self.group_idx)
        ):
            return self._skip(worker, "other_group")
        if stored or isinstance(event, BlockStored):
            kind = event.kv_cache_spec_kind
            if window is None and kind is not None and kind not in PREFIX_KINDS:
                return self._skip(worker, "not_prefix_kind")
            operation = "add"
        elif isinstance(event, BlockRemoved):
            operation = "remove"
        else:  # the model has three event kinds; anything else is a caller's bug
            raise InvalidArgument(f"not a KV event: {type(event).__name__}", field="events")
        try:
            tier = medium_tier(event.medium)
        except InvalidArgument:
            return self._skip(worker, "bad_medium")
        return operation, tier, event.block_hashes, window

    def _skip(self, worker: str, reason: str) -> None:
        self.metrics.ignored_counts[worker, reason].inc()
        return None
