"""The worker registry: discovery, admission into pools, event following, health, rejoin.

Per worker address (``--worker HOST:PORT``) the registry keeps one gRPC channel and a state:

- ``ready``: admitted to at least one pool; its KV events are followed (one consumer task per
  served model, so one worker's batches are applied in order) and requests are routed to it.
- ``refused``: reachable, but no model of it may join its pool (reasons: ``pool.Refusal``).
- ``down``: not answering. Its pools stop routing to it, its consumers stop and its index
  entries are cleared at once (the blocks may be gone, and an index that over-reports sends
  requests to a worker that lost the prefix).

A poll every ``interval`` seconds reads each worker's ``GetLoad`` (and :meth:`refresh` reads it
after each request forwarded there): the load and KV blocks in use feed the routing cost,
a failure marks it down, and a new ``instance_id`` at a known address (an engine restart) makes
it leave and rejoin. Down and refused workers are described again at each poll; a worker that
answers again rejoins with a cleared index entry, rebuilt from its events (replayed from
sequence 0 as far as the engine still buffers them). Joining always clears first, so entries
a previous router run left in a shared Redis index are never trusted.

The pool of a model is built from the first worker admitted for it (``pool_setup``); later
workers must match it (``Pool.refusal``). Refusals are counted by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from tokenkeys._gen.openengine.v1 import openengine_pb2_grpc
from tokenkeys.access.channel import PLAIN, ChannelSecurity
from tokenkeys.client.engine import RemoteEngine
from tokenkeys.errors import TokenkeysError, Unavailable
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.ingest.backoff import BackoffSettings
from tokenkeys.router.ingest.follow import follow_events
from tokenkeys.router.ingest.ingestor import EventIngestor, IngestMetrics
from tokenkeys.router.metrics import RouterMetrics
from tokenkeys.router.workers.discovery import (
    EventSource,
    ModelDescription,
    WorkerLoad,
    check_address,
    describe_worker,
    read_load,
)
from tokenkeys.router.workers.pool import Pool, Refusal, choose_source
from tokenkeys.router.workers.state import STATES, WorkerState, pool_status
from tokenkeys.router.workers.trust import flag_worker

log = logging.getLogger(__name__)

#: Builds the pool of a model from the first worker serving it (``pool_setup.build_pool``).
PoolFactory = Callable[[str, ModelDescription], Awaitable[Pool]]
#: Called with (pool, address) when a worker leaves a pool.
LeaveListener = Callable[[Pool, str], None]


class WorkerRegistry:
    """Workers by address and pools by model; see the module doc.

    Create and use it inside one event loop (gRPC asyncio channels belong to a loop). Call
    :meth:`add` for each address, then :meth:`start` to begin polling; :meth:`close` at the end.
    """

    def __init__(
        self,
        index: PrefixIndex,
        pool_factory: PoolFactory,
        *,
        metrics: RouterMetrics | None = None,
        ingest_metrics: IngestMetrics | None = None,
        interval: float = 1.0,
        timeout: float = 2.0,
        retry_delay: float = 0.5,
        foreign_interval: float = 5.0,
        security: ChannelSecurity = PLAIN,
        write_backoff: BackoffSettings | None = None,
        silent_after: float = 30.0,
    ) -> None:
        self.index = index
        #: Delays before a worker whose index writes failed is rebuilt (``ingest.backoff``).
        self.write_backoff = write_backoff if write_backoff is not None else BackoffSettings()
        #: Seconds without an event batch after a request before a worker is flagged silent.
        self.silent_after = silent_after
        #: TLS and bearer token of the channels to the workers.
        self.security = security
        self.pool_factory = pool_factory
        self.metrics = metrics if metrics is not None else RouterMetrics()
        self.ingest_metrics = ingest_metrics if ingest_metrics is not None else IngestMetrics()
        self.interval = interval
        self.timeout = timeout
        self.retry_delay = retry_delay
        self.foreign_interval = foreign_interval
        self.pools: dict[str, Pool] = {}
        self.ingestors: dict[str, EventIngestor] = {}
        self.workers: dict[str, WorkerState] = {}
        self.on_leave: list[LeaveListener] = []
        #: False while the prefix index answers Unavailable (as of the last poll).
        self.index_available = True
        self._poller: asyncio.Task | None = None
        self._refreshing: set[str] = set()
        self._wake = asyncio.Event()

    # --- lifecycle -------------------------------------------------------------------------

    async def add(self, address: str) -> WorkerState:
        """Register ``address`` and try to admit it now (unreachable: down, retried by polls)."""
        check_address(address)
        if address in self.workers:
            return self.workers[address]
        channel = self.security.aio_channel(address)
        ws = WorkerState(address, channel, openengine_pb2_grpc.ControlStub(channel))
        self.workers[address] = ws
        await self._check(ws)
        return ws

    async def start(self) -> None:
        """Start polling every ``interval`` seconds."""
        if self._poller is None:
            self._poller = asyncio.ensure_future(self._poll_forever())

    async def close(self) -> None:
        """Stop polling and every consumer, close the channels (the index is the caller's)."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(BaseException):
                await self._poller
            self._poller = None
        for ws in self.workers.values():
            await self._stop_consumers(ws)
            await ws.channel.close()

    def refresh(self, address: str) -> None:
        """Read ``address``'s load now (in the background), e.g. after a request finished there.

        Polls alone leave the load and KV usage up to ``interval`` seconds old, and a burst of
        new prefixes would then tie on stale figures; at most one refresh per worker runs.
        """
        ws = self.workers.get(address)
        if ws is None or ws.state != "ready" or address in self._refreshing:
            return
        self._refreshing.add(address)
        task = asyncio.ensure_future(self._refresh(ws))
        task.add_done_callback(lambda _: self._refreshing.discard(address))

    async def _refresh(self, ws: WorkerState) -> None:
        try:
            load = await read_load(ws.address, ws.control, timeout=self.timeout)
        except TokenkeysError:
            self.suspect(ws.address)  # the next check decides
            return
        if load.instance_id != ws.instance_id:
            self.suspect(ws.address)
            return
        self._apply_load(ws, load)

    def _apply_load(self, ws: WorkerState, load: WorkerLoad) -> None:
        for model in ws.engines:
            member = self.pools[model].members.get(ws.address)
            if member is not None:
                member.view.polled(load.load, load.kv_usage, load.used_kv_blocks)

    def suspect(self, address: str) -> None:
        """A request to ``address`` failed: check it at once instead of at the next poll."""
        self._wake.set()

    async def poll_once(self) -> None:
        """Check the index and every worker once (what each poll does)."""
        await self._check_index()
        await asyncio.gather(*(self._check(ws) for ws in list(self.workers.values())))
        self._count_states()
        for ws in self.workers.values():
            flag_worker(self.metrics, self.pools, ws, self.silent_after)

    async def _check_index(self) -> None:
        """Notice the index going away and coming back (a Redis restart comes back empty).

        When it is back, every followed worker is rebuilt: cleared and replayed from sequence 0
        (a gRPC follower at once; a ZMQ follower at its next batch, which is when a ZMQ
        subscriber can ask for a replay).
        """
        try:
            await self.index.workers()
        except Unavailable as exc:
            if self.index_available:
                log.warning("prefix index unavailable, routing by load: %s", exc.message)
            self.index_available = False
            return
        if self.index_available:
            return
        self.index_available = True
        log.info("prefix index available again: rebuilding every worker's entries")
        for ws in self.workers.values():
            for follower in ws.followers.values():
                follower.rebuild()

    async def _poll_forever(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.poll_once()
            except Exception:  # a poll must never end the loop; the next one retries
                log.exception("worker poll failed")

    # --- one worker --------------------------------------------------------------------------

    async def _check(self, ws: WorkerState) -> None:
        async with ws.lock:
            if ws.state == "ready":
                try:
                    load = await read_load(ws.address, ws.control, timeout=self.timeout)
                except TokenkeysError as exc:
                    await self._go_down(ws, exc.message)
                    return
                if load.instance_id and load.instance_id != ws.instance_id:
                    log.info("worker %s restarted (instance %s)", ws.address, load.instance_id)
                    self.metrics.worker_events.labels("restarted").inc()
                    await self._leave_all(ws, "worker_restarted")
                    await self._join(ws, "rejoined")
                    return
                self._apply_load(ws, load)
                return
            await self._join(ws, "joined" if ws.description is None else "rejoined")

    async def _join(self, ws: WorkerState, event: str) -> None:
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
        self._count_states()

    async def _admit(self, ws: WorkerState, model: ModelDescription) -> Refusal | None:
        if model.key_spec is None:
            return Refusal(
                ws.address,
                model.name,
                "no_key_spec",
                f"worker {ws.address} advertises no cache-key spec for model {model.name!r}, "
                "so its KV-event hashes cannot be matched; serve it with a cache-key profile",
            )
        pool = self.pools.get(model.name)
        if pool is None:
            try:
                pool = await self.pool_factory(ws.address, model)
            except TokenkeysError as exc:
                return Refusal(ws.address, model.name, "pool_setup", exc.message)
            self.pools[model.name] = pool
            self.ingestors[model.name] = EventIngestor(
                self.index,
                pool.key_spec.spec,
                group_idx=pool.group_idx,
                metrics=self.ingest_metrics,
            )
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
        ws.consumers[model.name] = asyncio.ensure_future(
            self._consume(ws, model.name, source, ingestor)
        )
        ws.engines[model.name] = RemoteEngine(ws.address, model.name, ws.channel)
        pool.join(ws.address, ws.instance_id, source)
        return None

    async def _consume(
        self, ws: WorkerState, model: str, source: EventSource, ingestor: EventIngestor
    ) -> None:
        """Follow one model's events of ``ws`` until cancelled."""
        await follow_events(
            ws,
            model,
            source,
            ingestor,
            retry_delay=self.retry_delay,
            foreign_interval=self.foreign_interval,
            on_foreign=lambda: self._foreign(ws, model),
            backoff=self.write_backoff.new(),
        )

    def _foreign(self, ws: WorkerState, model: str) -> None:
        """Events of another spec arrived: check whether the worker's advertisement changed."""
        self.metrics.worker_events.labels("foreign_events").inc()
        asyncio.ensure_future(self._recheck_spec(ws, model))

    async def _recheck_spec(self, ws: WorkerState, model: str) -> None:
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
                await self._leave(ws, model, "worker_refused")
                ws.refusals.append(refusal)
                self.metrics.refused.labels(model, refusal.reason).inc()
                log.warning("refused %s for %s: %s", ws.address, model, refusal.message)
                if not ws.engines:
                    ws.state = "refused"
                self._count_states()

    async def _go_down(self, ws: WorkerState, message: str) -> None:
        log.warning("worker %s is down: %s", ws.address, message)
        ws.error = message
        await self._leave_all(ws, "worker_down")
        ws.state = "down"
        self.metrics.worker_events.labels("down").inc()
        self._count_states()

    async def _leave_all(self, ws: WorkerState, reason: str) -> None:
        for model in list(ws.engines):
            await self._leave(ws, model, reason)

    async def _leave(self, ws: WorkerState, model: str, reason: str) -> None:
        task = ws.consumers.pop(model, None)
        ws.followers.pop(model, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        ws.engines.pop(model, None)
        pool = self.pools[model]
        pool.leave(ws.address)
        for listener in self.on_leave:
            listener(pool, ws.address)
        try:
            await self.ingestors[model].reset(pool.index_id(ws.address), reason)
        except Unavailable as exc:  # cleared at its rejoin instead
            log.warning("could not clear %s@%s: %s", ws.address, model, exc.message)

    async def _stop_consumers(self, ws: WorkerState) -> None:
        for task in ws.consumers.values():
            task.cancel()
        for task in ws.consumers.values():
            with contextlib.suppress(BaseException):
                await task
        ws.consumers.clear()
        ws.followers.clear()

    # --- views -------------------------------------------------------------------------------

    def engine(self, address: str, model: str) -> RemoteEngine:
        """The forwarding engine of ``model`` at ``address`` (a ready member)."""
        ws = self.workers.get(address)
        engine = ws.engines.get(model) if ws is not None else None
        if engine is None:
            raise Unavailable(
                f"worker {address} no longer serves {model!r} here (it left its pool)",
                field="worker",
            )
        return engine

    def _count_states(self) -> None:
        for model in self.pools:
            counts = dict.fromkeys(STATES, 0)
            for ws in self.workers.values():
                if model in ws.engines:
                    counts["ready"] += 1
                elif ws.description is not None and ws.description.model(model) is not None:
                    counts["down" if ws.state == "down" else "refused"] += 1
            for state, count in counts.items():
                self.metrics.workers.labels(model, state).set(count)

    def status(self) -> dict:
        """Pools and workers as JSON (``GET /router/workers``)."""
        return {
            "pools": [pool_status(pool) for pool in self.pools.values()],
            "workers": [
                ws.as_dict(flag_worker(self.metrics, self.pools, ws, self.silent_after))
                for ws in self.workers.values()
            ],
        }
