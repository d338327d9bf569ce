"""The worker registry: workers by address, pools by model, and the parts that keep them.

Per worker address (``--worker HOST:PORT``) the registry keeps one gRPC channel and a state:

- ``ready``: admitted to at least one pool; its KV events are followed (one consumer task per
  served model, so one worker's batches are applied in order) and requests are routed to it.
- ``refused``: reachable, but no model of it may join its pool (reasons: ``pool.Refusal``).
- ``down``: not answering (refusing connections, or ``down_after`` polls in a row without an
  answer before the deadline). Its pools stop routing to it, its consumers stop and its index
  entries are cleared at once (the blocks may be gone, and an index that over-reports sends
  requests to a worker that lost the prefix).

Each concern has its module: admission into pools (``admission``), following events
(``following``), health polling (``health``), the status view (``state``). Every background
task belongs to one of them and ends at :meth:`WorkerRegistry.close`.
"""

from __future__ import annotations

from tokenkeys._gen.openengine.v1 import openengine_pb2_grpc
from tokenkeys.access.channel import PLAIN, ChannelSecurity
from tokenkeys.engine.remote import RemoteEngine
from tokenkeys.errors import Unavailable
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.ingest.backoff import BackoffSettings
from tokenkeys.router.ingest.ingestor import EventIngestor, IngestMetrics
from tokenkeys.router.metrics import RouterMetrics
from tokenkeys.router.workers.admission import Admission, LeaveListener, PoolFactory
from tokenkeys.router.workers.discovery import check_address
from tokenkeys.router.workers.following import EventFollowing
from tokenkeys.router.workers.health import DOWN_AFTER, HealthPolling
from tokenkeys.router.workers.pool import Pool
from tokenkeys.router.workers.state import WorkerState
from tokenkeys.router.workers.status import registry_status
from tokenkeys.router.workers.tasks import BackgroundTasks


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
        down_after: int = DOWN_AFTER,
        retry_delay: float = 0.5,
        foreign_interval: float = 5.0,
        security: ChannelSecurity = PLAIN,
        write_backoff: BackoffSettings | None = None,
        silent_after: float = 30.0,
    ) -> None:
        self.index = index
        #: TLS and bearer token of the channels to the workers.
        self.security = security
        self.metrics = metrics if metrics is not None else RouterMetrics()
        self.workers: dict[str, WorkerState] = {}
        self._tasks = BackgroundTasks()
        # (address, model) pairs whose repair (a background resync) is under way.
        self._repairing: set[tuple[str, str]] = set()
        self.following = EventFollowing(
            retry_delay=retry_delay,
            foreign_interval=foreign_interval,
            on_foreign=self._foreign,
            write_backoff=write_backoff,
        )
        self.admission = Admission(
            index,
            pool_factory,
            self.following,
            self.workers,
            metrics=self.metrics,
            ingest_metrics=ingest_metrics if ingest_metrics is not None else IngestMetrics(),
            timeout=timeout,
            on_lost=self._lost,
        )
        self.health = HealthPolling(
            index,
            self.admission,
            self.workers,
            interval=interval,
            timeout=timeout,
            down_after=down_after,
            silent_after=silent_after,
        )

    @property
    def pools(self) -> dict[str, Pool]:
        """Pools by model name."""
        return self.admission.pools

    @property
    def ingestors(self) -> dict[str, EventIngestor]:
        """The event ingestor of each pool."""
        return self.admission.ingestors

    @property
    def on_leave(self) -> list[LeaveListener]:
        """Called with (pool, address) when a worker leaves a pool."""
        return self.admission.on_leave

    @property
    def index_available(self) -> bool:
        """False while the prefix index answers Unavailable (as of the last poll)."""
        return self.health.index_available

    async def add(self, address: str) -> WorkerState:
        """Register ``address`` and try to admit it now (unreachable: down, retried by polls)."""
        check_address(address)
        if address in self.workers:
            return self.workers[address]
        channel = self.security.aio_channel(address)
        ws = WorkerState(address, channel, openengine_pb2_grpc.ControlStub(channel))
        self.workers[address] = ws
        await self.health.check(ws)
        return ws

    async def start(self) -> None:
        """Start polling every ``interval`` seconds."""
        self.health.start()

    async def close(self) -> None:
        """Stop polling, rechecks and every consumer, close the channels (the index is the
        caller's)."""
        await self.health.close()
        await self._tasks.close()
        for ws in self.workers.values():
            await self.following.stop_all(ws)
            await ws.channel.close()

    def refresh(self, address: str) -> None:
        """Read ``address``'s load now, in the background (see ``health``)."""
        self.health.refresh(address)

    def suspect(self, address: str) -> None:
        """A request to ``address`` failed: check it at once instead of at the next poll."""
        self.health.suspect(address)

    async def poll_once(self) -> None:
        """Check the index and every worker once (what each poll does)."""
        await self.health.poll_once()

    def _foreign(self, ws: WorkerState, model: str) -> None:
        """Events of another spec arrived: check whether the worker's advertisement changed."""
        self.metrics.worker_events.labels("foreign_events").inc()
        self._tasks.spawn(self.admission.recheck_spec(ws, model))

    async def resync(self, address: str, model: str, reason: str) -> bool:
        """Rebuild a followed worker's entries of ``model`` from its snapshot, counted under
        ``reason`` (``EventFollowing.resync``); False when it is not followed."""
        ws = self.workers.get(address)
        return ws is not None and await self.following.resync(ws, model, reason)

    def repair(self, address: str, model: str, reason: str) -> bool:
        """:meth:`resync` in the background (a caller inside a consumer, or answering a request,
        must not wait for it); False when one of that worker and model is under way already."""
        if (address, model) in self._repairing:
            return False
        self._repairing.add((address, model))

        async def run() -> None:
            try:
                await self.resync(address, model, reason)
            finally:
                self._repairing.discard((address, model))

        self._tasks.spawn(run())
        return True

    def _lost(self, worker: str) -> None:
        """Events of index id ``worker`` were lost for good: it was cleared; rebuild it from
        its snapshot when its engine has one (without, a resync would only replay the same
        buffer and lose them again, so the worker stays cleared and is followed on)."""
        address, _, model = worker.partition("@")
        ws = self.workers.get(address)
        if ws is not None and model in ws.snapshot_models:
            self.repair(address, model, "events_lost")

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

    def status(self) -> dict:
        """Pools and workers as JSON (``GET /router/workers``); reads only."""
        return registry_status(self.pools, self.workers, self.health.silent_after)
