"""``SubscribeKvEvents``: one served model's KV events from a sequence number on, in smg's form.

The batches come from the server's hosting (:meth:`~tokenkeys.server.runtime.hosting.Hosting.
subscribe`, the same stream OpenEngine's ``Control.SubscribeKvEvents`` serves): this process's
stream for an engine whose events it streams (simulated, or the vLLM a sidecar fronts), the
remote engine's own for a forwarded one. Each keeps its sequence number (the ZMQ sequence
number of the same batch) and passes one
:class:`~tokenkeys.server.grpc.vllm_engine.events.SmgEventConverter`.

Where a stream starts, by ``start_sequence_number``:

- 0 ("start from current state"): every batch still buffered, then live ones, so the
  subscriber learns the blocks stored so far (vLLM's relay keeps none and serves live only);
- n > 0: from batch n while it is still buffered; OUT_OF_RANGE when the first batch the stream
  has is later than n (vLLM's relay keeps nothing and refuses every n > 0 so).

A subscriber that falls behind the stream's backlog gets DATA_LOSS, vLLM's relay's answer to a
gap it cannot fill: smg then clears what it indexed for the worker and subscribes from 0.
A stopping server (or a remote engine ending its stream) ends it with that error's status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from tokenkeys._gen.openengine.v1 import kv_pb2
from tokenkeys.engine.proto_errors import error_of
from tokenkeys.errors import DataLoss, LimitExceeded, OutOfRange
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.server.grpc.vllm_engine.events import SmgEventConverter
from tokenkeys.server.grpc.vllm_engine.stubs import common_pb2
from tokenkeys.server.runtime.hosting import Hosting
from tokenkeys.serving.models import ServedModel


async def smg_batches(
    hosting: Hosting, model: ServedModel, start: int
) -> AsyncIterator[common_pb2.KvEventBatch]:
    """``model``'s batches from ``start`` (see the module doc), converted for one subscriber."""
    codec, converter = ProtobufEventCodec(), SmgEventConverter()
    request = kv_pb2.SubscribeKvEventsRequest(model=model.name, start_sequence_number=start)
    first = True
    async for message in hosting.subscribe(model, request):
        if message.HasField("error"):
            error = error_of(message.error, "the KV-event stream")
            if isinstance(error, LimitExceeded):  # the subscriber fell behind: batches lost
                raise DataLoss(error.message, field="start_sequence_number")
            raise error
        seq, batch = codec.decode(message.batch)
        if first and start and seq > start:
            raise OutOfRange(
                f"start_sequence_number {start} is no longer kept: the oldest batch this stream "
                f"holds is {seq}; subscribe from 0",
                field="start_sequence_number",
            )
        first = False
        yield converter.convert(seq, batch)
