"""Joining a worker's KV events late: load its snapshot, then follow from where it is valid.

Before following a worker's stream, the router asks the engine for its snapshot
(``OpenEngineKvSnapshot.GetKvSnapshot``, ``events.snapshot``): every block the stream says is
cached, valid at ``next_sequence_number``. The snapshot goes through the ingestor like any
batch (it opens with ``AllBlocksCleared``, so it replaces whatever the index held for the
worker); the subscription then starts at ``next_sequence_number``: replayed from the engine's
buffer up to the live batches, so nothing is missed and nothing applied twice. So a router
started after an engine served for hours routes by what the engine holds, not only by what
its replay buffer still has.

An engine without the service (``UNIMPLEMENTED``: other OpenEngine servers, older tokenkeys)
or a failed load leaves the router as before: follow from sequence 0, replaying what the
engine still buffers.
"""

from __future__ import annotations

import dataclasses
import logging

import grpc

from tokenkeys._gen.openengine.v1 import kv_snapshot_pb2, kv_snapshot_pb2_grpc
from tokenkeys.errors import TokenkeysError
from tokenkeys.events.model import SpecRef
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.router.ingest.ingestor import EventIngestor

log = logging.getLogger(__name__)

#: Seconds a snapshot may take to arrive (a large cache is a few MB).
TIMEOUT = 30.0


async def load_snapshot(
    channel: grpc.aio.Channel,
    model: str,
    worker: str,
    ingestor: EventIngestor,
    spec: SpecRef,
    *,
    timeout: float = TIMEOUT,
) -> int | None:
    """Apply ``model``'s snapshot on ``channel`` as ``worker``'s entries; the sequence number
    to follow from, or None when there is none (then follow from 0)."""
    stub = kv_snapshot_pb2_grpc.OpenEngineKvSnapshotStub(channel)
    try:
        reply = await stub.GetKvSnapshot(
            kv_snapshot_pb2.GetKvSnapshotRequest(model=model), timeout=timeout
        )
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.UNIMPLEMENTED:
            log.info("no KV snapshot of %s (%s): replaying its buffer", worker, error.details())
        return None
    try:
        _, batch = ProtobufEventCodec().decode(reply.batch)
        if reply.batch.HasField("key_spec"):
            key_spec = reply.batch.key_spec
            spec = SpecRef(key_spec.profile_id, key_spec.spec_fingerprint)
        if not await ingestor.apply(worker, dataclasses.replace(batch, spec=spec)):
            return None  # a foreign spec: the stream's batches will say so too
    except TokenkeysError as exc:
        log.info("KV snapshot of %s not loaded (%s): replaying its buffer", worker, exc.message)
        return None
    if not reply.complete:
        log.info("KV snapshot of %s is partial: %s", worker, reply.incomplete_reason)
    return reply.next_sequence_number
