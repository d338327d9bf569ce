"""Admitting workers into pools, and taking them out: join, leave, go down, recheck.

The pool of a model is built from the first worker admitted for it (``pool_setup``); later
workers must match it (``Pool.refusal``). Refusals are counted by reason. Joining always clears
the worker's index entries first (entries a previous router run left in a shared Redis index
are never trusted) and starts following its events; leaving stops them and clears again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from tokenkeys.engine.remote import RemoteEngine
from tokenkeys.errors import TokenkeysError, Unavailable
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.ingest.ingestor import EventIngestor, IngestMetrics
from tokenkeys.router.metrics import RouterMetrics
from tokenkeys.router.workers.discovery import ModelDescription, describe_worker
from tokenkeys.router.workers.following import EventFollowing
from tokenkeys.router.workers.pool import Pool, Refusal, choose_source, spec_refusal
from tokenkeys.router.workers.state import WorkerState, count_states

log = logging.getLogger(__name__)

#: Builds the pool of a model from the first worker serving it (``pool_setup.build_pool``).
PoolFactory = Callable[[str, ModelDescription], Awaitable[Pool]]
#: Called with (pool, address) when a worker leaves a pool.
LeaveListener = Callable[[Pool, str], None]


class Admission:
    """Pools by model, and the admission of workers into them; see the module doc."""

    def __init__(
        self,
        index: PrefixIndex,
        pool_factory: PoolFactory,
        following: EventFollowing,
        workers: dict[str, WorkerState],
        *,
        metrics: RouterMetrics,
        ingest_metrics: IngestMetrics,
        timeout: float,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.index = index
        #: Told the index id of a worker whose events were lost for good (the registry's repair).
        self.on_lost = on_lost
        self.pool_factory = pool_factory
        self.following = following
        self.workers = workers
        self.metrics = metrics
        self.ingest_metrics = ingest_metrics
        self.timeout = timeout
        self.pools: dict[str, Pool] = {}
        self.ingestors: dict[str, EventIngestor] = {}
        self.on_leave: list[LeaveListener] = []

    def count_states(self) -> None:
        """Refresh the worker-state gauges."""
        count_states(self.metrics, self.pools, self.workers)

    async def join(self, ws: WorkerState, event: str) -> None:
        """Describe ``ws`` and admit each model it serves (``event``: joined or rejoined)."""
        try:
            desc = await describe_worker(ws.address, ws.control, timeout=self.timeout)
        except Unavailable as exc:
            ws.state, ws.error = "down", exc.message
            return
        except TokenkeysError as exc:
            ws.state, ws.error = "refused", exc.message
            return
        same = ws.state == "refused" and desc.instance_id == ws.instance_id
        if (
            same
            and desc == ws.description
            and not any(r.reason == "pool_setup" for r in ws.refusals)
        ):
            return  # the same instance saying the same, refused before: nothing changed
        # (A failed pool setup may be transient, a pull cut short: it is retried at each poll,
        # and counted again only if the reason changes.)
        known = {(r.model, r.reason) for r in ws.refusals} if same else set()
        ws.description, ws.instance_id, ws.error = desc, desc.instance_id, None
        ws.refusals = []
        for model in desc.models:
            refusal = await self._admit(ws, model)
            if refusal is not None:
                ws.refusals.append(refusal)
                if (refusal.model, refusal.reason) not in known:
                    self.metrics.refused.labels(model.name, refusal.reason).inc()
                    log.warning("refused %s for %s: %s", ws.address, model.name, refusal.message)
        ws.state = "ready" if ws.engines else "refused"
        if ws.engines:
            self.metrics.worker_events.labels(event).inc()
            log.info("worker %s %s: %s", ws.address, event, ", ".join(sorted(ws.engines)))
        self.count_states()

    async def _pool(self, ws: WorkerState, model: ModelDescription) -> Pool:
        """The model's pool, built from ``ws`` when it is the first worker serving it."""
        pool = self.pools.get(model.name)
        if pool is None:
            pool = await self.pool_factory(ws.address, model)
            self.pools[model.name] = pool
            self.ingestors[model.name] = EventIngestor(
                self.index,
                pool.key_spec.spec,
                layout=pool.layout,
                metrics=self.ingest_metrics,
                on_lost=self.on_lost,
            )
        return pool

    async def _admit(self, ws: WorkerState, model: ModelDescription) -> Refusal | None:
        missing = spec_refusal(ws.address, model)  # before a pool is built from this worker
        if missing is not None:
            return missing
        try:
            pool = await self._pool(ws, model)
        except TokenkeysError as exc:
            return Refusal(ws.address, model.name, "pool_setup", exc.message)
        assert ws.instance_id is not None
        refusal = pool.refusal(ws.address, ws.instance_id, model)
        if refusal is not None:
            return refusal
        source = choose_source(model, pool.key_spec, pool.transport)
        assert source is not None
        ingestor = self.ingestors[model.name]
        worker = pool.index_id(ws.address)
        try:
            await ingestor.reset(worker, "worker_joined")
        except Unavailable as exc:  # the consumer clears it once the index is back
            log.warning("could not clear %s in the prefix index: %s", worker, exc.message)
        self.following.start(ws, model.name, source, ingestor)
        ws.engines[model.name] = RemoteEngine(ws.address, model.name, ws.channel)
        pool.join(ws.address, ws.instance_id, source, keys_trusted=model.keys_verified)
        if not model.keys_verified:
            log.warning(
                "worker %s advertises unverified keys for %s: routed by load",
                ws.address,
                model.name,
            )
        return None

    async def recheck_spec(self, ws: WorkerState, model: str) -> None:
        """Events of another spec arrived: refuse ``ws`` for ``model`` if it now advertises one."""
        async with ws.lock:
            pool = self.pools.get(model)
            if pool is None or model not in ws.engines or ws.instance_id is None:
                return
            try:
                desc = await describe_worker(ws.address, ws.control, timeout=self.timeout)
            except TokenkeysError:
                return  # the poll decides about reachability
            served = desc.model(model)
            refusal = pool.refusal(ws.address, ws.instance_id, served) if served else None
            if refusal is not None:
                await self.leave(ws, model, "worker_refused")
                ws.refusals.append(refusal)
                self.metrics.refused.labels(model, refusal.reason).inc()
                log.warning("refused %s for %s: %s", ws.address, model, refusal.message)
                if not ws.engines:
                    ws.state = "refused"
                self.count_states()

    async def go_down(self, ws: WorkerState, message: str) -> None:
        """``ws`` stopped answering: out of every pool, its index entries cleared."""
        log.warning("worker %s is down: %s", ws.address, message)
        ws.error, ws.missed_polls = message, 0
        await self.leave_all(ws, "worker_down")
        ws.state = "down"
        self.metrics.worker_events.labels("down").inc()
        self.count_states()

    async def leave_all(self, ws: WorkerState, reason: str) -> None:
        """Take ``ws`` out of every pool."""
        for model in list(ws.engines):
            await self.leave(ws, model, reason)

    async def leave(self, ws: WorkerState, model: str, reason: str) -> None:
        """Take ``ws`` out of ``model``'s pool: events unfollowed, index entries cleared."""
        await self.following.stop(ws, model)
        ws.engines.pop(model, None)
        pool = self.pools[model]
        pool.leave(ws.address)
        for listener in self.on_leave:
            listener(pool, ws.address)
        try:
            await self.ingestors[model].reset(pool.index_id(ws.address), reason)
        except Unavailable as exc:  # cleared at its rejoin instead
            log.warning("could not clear %s@%s: %s", ws.address, model, exc.message)
