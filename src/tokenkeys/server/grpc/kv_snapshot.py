"""``OpenEngineKvSnapshot``: a served model's cached blocks, for consumers that join late.

The answer is the model's event stream's :class:`~tokenkeys.events.snapshot.Snapshot`: the
blocks its ledger holds (``AllBlocksCleared`` then one ``BlockStored`` per block, encoded like
``SubscribeKvEvents`` batches) and ``next_sequence_number``, from which the consumer follows
the stream. Behind ``--engine HOST:PORT`` the call is forwarded to the engine (its stream is
the one consumers follow).
"""

from __future__ import annotations

import grpc

from tokenkeys._gen.openengine.v1 import kv_snapshot_pb2, kv_snapshot_pb2_grpc
from tokenkeys.errors import Unsupported, from_grpc
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.events.snapshot import Snapshot
from tokenkeys.server.grpc import status as grpc_status
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.server.runtime.streamed import StreamedParts
from tokenkeys.serving.models import ModelRegistry


def snapshot_message(snapshot: Snapshot, codec: ProtobufEventCodec) -> kv_snapshot_pb2.KvSnapshot:
    """The wire form of ``snapshot`` (hashes encoded as the stream's batches are)."""
    return kv_snapshot_pb2.KvSnapshot(
        next_sequence_number=snapshot.next_seq,
        complete=snapshot.complete,
        incomplete_reason=snapshot.reason,
        batch=codec.encode(snapshot.next_seq, snapshot.batch),
    )


class KvSnapshotService(kv_snapshot_pb2_grpc.OpenEngineKvSnapshotServicer):
    """Snapshots of the served models' event streams (see the module doc)."""

    def __init__(self, models: ModelRegistry, runtime: EngineRuntime) -> None:
        self._models = models
        self._runtime = runtime

    @grpc_status.unary
    async def GetKvSnapshot(
        self, request: kv_snapshot_pb2.GetKvSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> kv_snapshot_pb2.KvSnapshot:
        model = self._models.get(request.model or None)
        parts = self._runtime.parts(model.name)
        if isinstance(parts, StreamedParts):
            return snapshot_message(parts.stream.snapshot(), parts.protobuf)
        channel = getattr(parts.engine, "channel", None)
        if channel is None:
            raise Unsupported(f"model {model.name!r} has no event stream here", field="model")
        stub = kv_snapshot_pb2_grpc.OpenEngineKvSnapshotStub(channel)
        try:
            return await stub.GetKvSnapshot(request)  # the forwarded engine's stream
        except grpc.RpcError as error:
            raise from_grpc(error) from None
