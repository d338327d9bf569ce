"""Following the KV events of admitted workers: one consumer per (worker, model), over the
transport its event source names.

Each consumer's task is owned here, in ``WorkerState.consumers``: started when the worker joins
a pool, cancelled and awaited when it leaves and when the registry closes, so one worker's
batches are applied in order and nothing follows a worker that is gone. First the engine's
snapshot is loaded (``ingest.snapshot``) and the stream is followed from the sequence number it
is valid at; an engine without one is followed from sequence 0 (the first batch replays what
the engine still buffers). ZMQ (vLLM's wire): a
:class:`~tokenkeys.events.zmq_subscriber.ZmqEventSubscriber` into a
:class:`~tokenkeys.router.ingest.consumer.ZmqEventConsumer`; the payload layout is the vLLM
release the worker named. gRPC: a
:class:`~tokenkeys.router.ingest.consumer_grpc.GrpcEventConsumer`. Either way the consumer is
recorded in ``ws.followers`` (its ``last_seq``, ``resyncing``) while it runs.

:meth:`EventFollowing.resync` rebuilds one worker on request (a caller that found its index
stale: short answers against the promise, a gap replay cannot fill): the worker is cleared at
once (scored with no cached blocks until rebuilt: an index that under-reports costs hits, one
that over-reports misroutes), its consumer is stopped and started again, so the snapshot is
loaded and the stream followed from where it is valid, exactly as when it joined. Counted in
``tokenkeys_router_worker_resyncs_total{reason, source}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_subscriber import ZmqEventSubscriber
from tokenkeys.router.ingest.backoff import BackoffSettings, WriteBackoff
from tokenkeys.router.ingest.consumer import ZmqEventConsumer
from tokenkeys.router.ingest.consumer_grpc import GrpcEventConsumer
from tokenkeys.router.ingest.ingestor import EventIngestor
from tokenkeys.router.ingest.snapshot import load_snapshot
from tokenkeys.router.workers.discovery import EventSource
from tokenkeys.router.workers.pool import index_worker_id
from tokenkeys.router.workers.state import WorkerState
from tokenkeys.router.workers.tasks import cancel

#: Called with (worker, model) when events of another spec arrive from it.
ForeignListener = Callable[[WorkerState, str], None]


class EventFollowing:
    """Starts and stops the event consumers of workers; see the module doc."""

    def __init__(
        self,
        *,
        retry_delay: float,
        foreign_interval: float,
        on_foreign: ForeignListener,
        write_backoff: BackoffSettings | None = None,
    ) -> None:
        self.retry_delay = retry_delay
        #: Delays before a worker whose index writes failed is rebuilt (``ingest.backoff``).
        self.write_backoff = write_backoff if write_backoff is not None else BackoffSettings()
        self.foreign_interval = foreign_interval
        self.on_foreign = on_foreign
        # What each running consumer follows, by (address, model), to start it again.
        self._followed: dict[tuple[str, str], tuple[EventSource, EventIngestor]] = {}

    def start(
        self, ws: WorkerState, model: str, source: EventSource, ingestor: EventIngestor
    ) -> None:
        """Follow ``model``'s events of ``ws`` from ``source`` until stopped."""
        self._start(ws, model, source, ingestor, None)

    def _start(
        self,
        ws: WorkerState,
        model: str,
        source: EventSource,
        ingestor: EventIngestor,
        resync: str | None,
    ) -> None:
        self._followed[ws.address, model] = (source, ingestor)
        ws.consumers[model] = asyncio.ensure_future(
            follow_events(
                ws,
                model,
                source,
                ingestor,
                retry_delay=self.retry_delay,
                foreign_interval=self.foreign_interval,
                on_foreign=lambda: self.on_foreign(ws, model),
                backoff=self.write_backoff.new(),
                resync=resync,
            )
        )

    async def resync(self, ws: WorkerState, model: str, reason: str) -> bool:
        """Rebuild ``model``'s entries of ``ws`` from its snapshot (see the module doc); False
        when that model of the worker is not followed."""
        followed = self._followed.get((ws.address, model))
        if followed is None or model not in ws.consumers:
            return False
        source, ingestor = followed
        await self.stop(ws, model)
        await ingestor.reset(index_worker_id(ws.address, model), "resync")
        self._start(ws, model, source, ingestor, reason)
        return True

    async def stop(self, ws: WorkerState, model: str) -> None:
        """Stop following ``model`` of ``ws`` and wait until its consumer ended."""
        task = ws.consumers.pop(model, None)
        ws.followers.pop(model, None)
        self._followed.pop((ws.address, model), None)
        await cancel(task)

    async def stop_all(self, ws: WorkerState) -> None:
        """Stop every consumer of ``ws``."""
        tasks = list(ws.consumers.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            await cancel(task)
        ws.consumers.clear()
        ws.followers.clear()
        for key in [k for k in self._followed if k[0] == ws.address]:
            del self._followed[key]

    @staticmethod
    def rebuild(workers: dict[str, WorkerState]) -> None:
        """After the index came back: every followed worker is cleared and replayed from 0.

        A gRPC follower resubscribes at once; a ZMQ follower at its next batch, which is when a
        ZMQ subscriber can ask for a replay. Either ends a write backoff's wait at once.
        """
        for ws in workers.values():
            for follower in ws.followers.values():
                follower.rebuild()


async def follow_events(
    ws: WorkerState,
    model: str,
    source: EventSource,
    ingestor: EventIngestor,
    *,
    retry_delay: float,
    foreign_interval: float,
    on_foreign: Callable[[], object],
    backoff: WriteBackoff,
    resync: str | None = None,
) -> None:
    """Apply ``model``'s events of ``ws`` from ``source`` until cancelled (``resync``: the
    reason this is a rebuild on request, counted once the snapshot is loaded or not)."""
    worker = index_worker_id(ws.address, model)
    assert source.spec is not None
    start = await load_snapshot(ws.channel, model, worker, ingestor, source.spec.spec)
    if start is None:
        ws.snapshot_models.discard(model)
    else:
        ws.snapshot_models.add(model)
    if resync is not None:
        origin = "replay" if start is None else "snapshot"
        ingestor.metrics.resyncs.labels(worker, resync, origin).inc()
    if source.transport == "zmq":
        subscriber = ZmqEventSubscriber(
            source.endpoint,
            replay_endpoint=source.replay_endpoint,
            topic=source.topic,
            start_seq=start or 0,
        )
        codec = VllmMsgpackCodec(source.wire_version, spec=source.spec.spec)
        consumer = ZmqEventConsumer(worker, subscriber, codec, ingestor, backoff=backoff)
        ws.followers[model] = consumer
        try:
            await consumer.run()
        finally:
            await subscriber.close()
        return
    assert ws.instance_id is not None
    follower = GrpcEventConsumer(
        worker,
        ws.control,
        model,
        ingestor,
        spec=source.spec.spec,
        instance_id=ws.instance_id,
        retry_delay=retry_delay,
        on_foreign=lambda _worker: on_foreign(),
        foreign_interval=foreign_interval,
        backoff=backoff,
    )
    follower.start_at(start)
    ws.followers[model] = follower
    await follower.run()
