"""Following one model's KV events of one worker, over the transport its source names.

First the engine's snapshot is loaded (``ingest.snapshot``) and the stream is followed from the
sequence number it is valid at; an engine without one is followed from sequence 0 (the first
batch replays what the engine still buffers). ZMQ (vLLM's wire): a
:class:`~tokenkeys.events.zmq_subscriber.ZmqEventSubscriber` into a
:class:`~tokenkeys.router.ingest.consumer.ZmqEventConsumer`; the payload layout is the vLLM
release the worker named. gRPC: a
:class:`~tokenkeys.router.ingest.consumer_grpc.GrpcEventConsumer`. Either way the consumer is
recorded in ``ws.followers`` (its ``last_seq``, ``resyncing``) while it runs.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_subscriber import ZmqEventSubscriber
from tokenkeys.router.ingest.backoff import WriteBackoff
from tokenkeys.router.ingest.consumer import ZmqEventConsumer
from tokenkeys.router.ingest.consumer_grpc import GrpcEventConsumer
from tokenkeys.router.ingest.ingestor import EventIngestor
from tokenkeys.router.ingest.snapshot import load_snapshot
from tokenkeys.router.workers.discovery import EventSource
from tokenkeys.router.workers.pool import index_worker_id
from tokenkeys.router.workers.state import WorkerState


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
) -> None:
    """Apply ``model``'s events of ``ws`` from ``source`` until cancelled."""
    worker = index_worker_id(ws.address, model)
    assert source.spec is not None
    start = await load_snapshot(ws.channel, model, worker, ingestor, source.spec.spec)
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
