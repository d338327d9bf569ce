"""Feeding one worker's ``SubscribeKvEvents`` stream into an :class:`EventIngestor`, in order.

The gRPC twin of :class:`~tokenkeys.router.ingest.consumer.ZmqEventConsumer`, with the same rules:

- sequence numbers are checked here (the stream replays from ``start_sequence_number``): a
  batch beyond the next expected one means batches were lost for good (not buffered any more)
  and clears the worker; a batch behind it means the engine restarted and clears it too;
- before every (re)subscription the engine's ``instance_id`` is compared with the one known: a
  new instance (a restart) clears the worker and subscribes from 0. (A restarted engine would
  otherwise wait for the old sequence number and its first batches would be missed silently.)
- a terminal ``EngineError`` (OVERLOADED when this subscriber fell behind, DRAINING when the
  engine stops) or a broken stream resubscribes from the next sequence number after a pause;
- an index failure (Redis down, or full) clears the worker once and stops reading until its
  :class:`~tokenkeys.router.ingest.backoff.WriteBackoff` is due, then resubscribes from 0 so
  the engine's buffer rebuilds its entries; :meth:`rebuild` does the same at once (the registry
  calls it when the index comes back, possibly empty);
- each batch carries the spec its hashes follow (tokenkeys field 100); a batch of another spec
  is ignored and counted by the ingestor, and ``on_foreign`` is told (at most once per
  ``foreign_interval`` seconds) so that the worker's advertisement is checked again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

import grpc

from tokenkeys._gen.openengine.v1 import kv_pb2, openengine_pb2_grpc, server_pb2
from tokenkeys.errors import Unavailable, from_grpc
from tokenkeys.events.model import SpecRef
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.router.index.model import check_worker
from tokenkeys.router.ingest.backoff import BackoffSettings, WriteBackoff
from tokenkeys.router.ingest.ingestor import EventIngestor

log = logging.getLogger(__name__)


class GrpcEventConsumer:
    """Follows ``model``'s KV events on ``control`` for index worker ``worker``.

    ``spec`` is the source's advertised spec, stamped on batches that carry none. Run
    :meth:`run` as a task and cancel it to stop.
    """

    def __init__(
        self,
        worker: str,
        control: openengine_pb2_grpc.ControlStub,
        model: str,
        ingestor: EventIngestor,
        *,
        spec: SpecRef,
        instance_id: str,
        retry_delay: float = 0.5,
        on_foreign: Callable[[str], object] | None = None,
        foreign_interval: float = 5.0,
        backoff: WriteBackoff | None = None,
    ) -> None:
        self.worker = check_worker(worker)
        self.control = control
        self.model = model
        self.ingestor = ingestor
        self.spec = spec
        self.instance_id = instance_id
        self.retry_delay = retry_delay
        self.on_foreign = on_foreign
        self.foreign_interval = foreign_interval
        self._told_foreign: float | None = None
        self.codec = ProtobufEventCodec()
        #: True while the index failed and the worker waits for a reset and a replay.
        self.resyncing = False
        #: When the worker may be rebuilt after failed index writes.
        self.backoff = backoff if backoff is not None else BackoffSettings().new()
        #: Sequence number of the last batch handled (applied, ignored or dropped).
        self.last_seq: int | None = None
        #: When the last batch was applied: ``time.time()`` (None before the first).
        self.applied_at: float | None = None
        # The worker's entries were cleared after the failure: a rebuild need not clear again.
        self._cleared = False
        self._next: int | None = None
        self._call: grpc.aio.UnaryStreamCall | None = None
        self._interrupted = False

    async def run(self) -> None:
        """Follow the stream until cancelled, resubscribing after breaks."""
        while True:
            try:
                await self._follow()
            except Unavailable as exc:
                log.info("KV events of %s: %s; resubscribing", self.worker, exc.message)
            await asyncio.sleep(self.retry_delay)

    async def _check_instance(self) -> None:
        try:
            load = await self.control.GetLoad(server_pb2.GetLoadRequest(), timeout=5.0)
        except grpc.RpcError as error:
            raise from_grpc(error) from None
        if load.instance_id and load.instance_id != self.instance_id:
            log.info(
                "worker %s is a new engine instance (%s, was %s)",
                self.worker,
                load.instance_id,
                self.instance_id,
            )
            self.instance_id = load.instance_id
            self._next = None
            await self.ingestor.reset(self.worker, "publisher_restart")

    def start_at(self, seq: int | None) -> None:
        """Subscribe from ``seq`` (a loaded snapshot's) instead of 0; None: from 0."""
        self._next = seq

    def rebuild(self) -> None:
        """Clear the worker and replay its events from 0 now (the index came back empty)."""
        self.resyncing, self._cleared = True, False
        self.backoff.retry_now()
        if self._call is not None:
            self._interrupted = True
            self._call.cancel()

    async def _follow(self) -> None:
        """One subscription, until it ends, breaks, or a resync needs a new one."""
        if self.resyncing:
            while not self.backoff.due():  # re-read each pause: rebuild() may end it early
                await asyncio.sleep(min(self.backoff.remaining(), self.retry_delay))
            if not self._cleared:
                try:
                    await self.ingestor.reset(self.worker, "index_recovered")
                except Unavailable as exc:
                    self.backoff.failed(exc.message)
                    raise
            self.resyncing, self._cleared = False, False
            self._next = None
            log.info("prefix index back: rebuilding %s from the engine's buffer", self.worker)
        await self._check_instance()
        start = self._next or 0
        call = self.control.SubscribeKvEvents(
            kv_pb2.SubscribeKvEventsRequest(start_sequence_number=start, model=self.model)
        )
        self._call = call
        loop = asyncio.get_running_loop()
        try:
            async for message in call:
                if message.WhichOneof("event") != "batch":
                    error = message.error
                    log.info(
                        "KV-event stream of %s ended by the engine: %s", self.worker, error.message
                    )
                    return
                applied = await self._handle(message.batch, start)
                if applied is None:  # the index failed: resubscribe once a reset succeeds
                    return
                if not applied and self.on_foreign is not None:
                    now = loop.time()
                    if (
                        self._told_foreign is None
                        or now - self._told_foreign >= self.foreign_interval
                    ):
                        self._told_foreign = now
                        self.on_foreign(self.worker)
        except asyncio.CancelledError:
            if not self._interrupted:
                raise
        except grpc.RpcError as error:
            if not self._interrupted:
                raise Unavailable(
                    f"KV-event stream of {self.worker} broke: {from_grpc(error).message}",
                    field="worker",
                ) from None
        finally:
            self._interrupted = False
            self._call = None
            call.cancel()

    async def _handle(self, message: kv_pb2.KvEventBatch, start: int) -> bool | None:
        """Apply one batch: True applied, False ignored (foreign spec), None: resync first."""
        seq, batch = self.codec.decode(message)
        spec = self.spec
        if message.HasField("key_spec"):
            spec = SpecRef(message.key_spec.profile_id, message.key_spec.spec_fingerprint)
        batch = dataclasses.replace(batch, spec=spec)
        expected = start if self._next is None else self._next
        if self.resyncing:
            self.ingestor.metrics.batches.labels(self.worker, "dropped").inc()
            return None
        try:
            applied = await self.ingestor.apply(
                self.worker,
                batch,
                restarted=seq < expected,
                # A first subscription holds no position: a run starts far above 0
                # (restart-safe sequence numbers), which is no loss.
                lost_before=max(0, seq - expected) if self._next is not None else 0,
                seq=seq,
            )
        except Unavailable as exc:
            self.resyncing = True
            self._cleared = await self.ingestor.write_failed(self.worker, self.backoff, exc.message)
            return None
        self.backoff.succeeded()
        self._next = seq + 1
        self.last_seq = seq
        if applied:
            self.applied_at = time.time()
        return applied
