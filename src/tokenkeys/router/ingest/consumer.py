"""Feeding one worker's ZMQ KV-event stream into an :class:`EventIngestor`, in order.

The subscriber moves bytes and repairs sequence gaps by replay; the codec decodes; the ingestor
applies. This module only connects them and keeps the index honest when the index itself fails:

- a sequence gap is replayed by the subscriber before the next delivery arrives, so batches
  come here in order; batches lost for good arrive as ``lost_before`` and clear the worker;
- a publisher restart arrives as ``restarted`` and clears the worker;
- an undecodable payload clears the worker (its events are unknown);
- an index failure (:class:`~tokenkeys.errors.Unavailable`: Redis down, or full) leaves the
  worker's entries partial: it is cleared once at once, and later deliveries are dropped until
  its :class:`~tokenkeys.router.ingest.backoff.WriteBackoff` is due; then the subscriber is
  rewound to sequence 0, so the next live batch first replays everything the publisher still
  buffers (vLLM keeps ``buffer_steps`` = 10,000 batches) and the worker's entries are rebuilt.
  Blocks stored before that window stay unknown (missed hits, never false ones).

Known limit: a Redis that restarts empty while a worker publishes nothing is noticed only at
that worker's next batch (when its clear and replay rebuild it).
"""

from __future__ import annotations

import logging
import time

from tokenkeys.errors import InvalidArgument, Unavailable
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_subscriber import Delivery, ZmqEventSubscriber
from tokenkeys.router.index.model import check_worker
from tokenkeys.router.ingest.backoff import BackoffSettings, WriteBackoff
from tokenkeys.router.ingest.ingestor import EventIngestor

log = logging.getLogger(__name__)


class ZmqEventConsumer:
    """Reads one worker's ``subscriber``, decodes with ``codec``, applies with ``ingestor``.

    The codec should stamp the source's :class:`~tokenkeys.events.model.SpecRef` (as
    advertised by discovery) on each batch; the ingestor compares it with the pool's. Run
    :meth:`run` as a task and cancel it to stop; the subscriber's owner closes it.
    """

    def __init__(
        self,
        worker: str,
        subscriber: ZmqEventSubscriber,
        codec: VllmMsgpackCodec,
        ingestor: EventIngestor,
        *,
        backoff: WriteBackoff | None = None,
    ) -> None:
        self.worker = check_worker(worker)
        self.subscriber = subscriber
        self.codec = codec
        self.ingestor = ingestor
        #: True while the index failed and the worker waits for a reset and a replay.
        self.resyncing = False
        #: When the worker may be rebuilt after failed index writes.
        self.backoff = backoff if backoff is not None else BackoffSettings().new()
        #: Sequence number of the last delivery handled (applied, ignored or dropped).
        self.last_seq: int | None = None
        #: When the last batch was applied: ``time.time()`` (None before the first).
        self.applied_at: float | None = None
        # The worker's entries were cleared after the failure: a rebuild need not clear again.
        self._cleared = False

    async def run(self) -> None:
        """Handle deliveries until cancelled (starts the subscriber if needed)."""
        await self.subscriber.start()
        while True:
            await self.handle(await self.subscriber.recv())

    async def handle(self, delivery: Delivery) -> None:
        """Handle one delivery (what :meth:`run` does for each)."""
        metrics = self.ingestor.metrics
        try:
            if self.resyncing:
                if not self.backoff.due():
                    metrics.batches.labels(self.worker, "dropped").inc()
                    self.last_seq = delivery.seq
                    return
                if not self._cleared:
                    await self.ingestor.reset(self.worker, "index_recovered")
                self.resyncing, self._cleared = False, False
                self.subscriber.rewind(0)
                log.info(
                    "prefix index back: rebuilding %s from the publisher's replay buffer",
                    self.worker,
                )
            try:
                batch = self.codec.decode(delivery.payload)
            except InvalidArgument as exc:
                metrics.batches.labels(self.worker, "undecodable").inc()
                log.warning(
                    "undecodable KV-event batch %d of %s: %s",
                    delivery.seq,
                    self.worker,
                    exc.message,
                )
                await self.ingestor.reset(self.worker, "undecodable")
            else:
                if await self.ingestor.apply(
                    self.worker,
                    batch,
                    restarted=delivery.restarted,
                    lost_before=delivery.lost_before,
                    seq=delivery.seq,
                ):
                    self.applied_at = time.time()
                self.backoff.succeeded()
        except Unavailable as exc:
            if self.resyncing:  # the rebuild's clear failed too (Redis down): try again later
                metrics.batches.labels(self.worker, "dropped").inc()
                self.backoff.failed(exc.message)
            else:
                self.resyncing = True
                self._cleared = await self.ingestor.write_failed(
                    self.worker, self.backoff, exc.message
                )
        self.last_seq = delivery.seq

    def rebuild(self) -> None:
        """Clear and replay at the next delivery (the index came back, possibly empty)."""
        self.resyncing, self._cleared = True, False
        self.backoff.retry_now()
