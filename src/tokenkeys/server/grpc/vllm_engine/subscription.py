"""``SubscribeKvEvents``: one served model's KV events from a sequence number on, in smg's form.

Where the batches come from is the hosting's business: a hosted engine (simulated, or the vLLM a
sidecar fronts) has this server's :class:`~tokenkeys.events.stream.EventStream`; a remote
OpenEngine engine has its own ``Control.SubscribeKvEvents``, relayed here. Either way each batch
keeps its sequence number (the ZMQ sequence number of the same batch) and passes one
:class:`~tokenkeys.server.grpc.vllm_engine.events.SmgEventConverter`.

Where a stream starts, by ``start_sequence_number``:

- 0 ("start from current state"): every buffered batch when the buffer still holds the
  stream's first batch, so the subscriber learns every block stored so far; live batches only
  once it no longer does (what vLLM's relay always serves for 0);
- n > 0: from batch n when it is still buffered or is the next one; OUT_OF_RANGE naming the
  oldest kept otherwise (vLLM's relay keeps nothing and refuses every n > 0 so).

A subscriber that falls behind the stream's backlog gets DATA_LOSS, vLLM's relay's answer to a
gap it cannot fill: smg then clears what it indexed for the worker and subscribes from 0.
A stopping server ends the stream with UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from tokenkeys._gen.openengine.v1 import kv_pb2
from tokenkeys.engine.remote import RemoteEngine
from tokenkeys.errors import DataLoss, LimitExceeded, OutOfRange, Unavailable, from_grpc
from tokenkeys.events.model import EventBatch
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.events.stream import EventStream
from tokenkeys.server.grpc.vllm_engine.events import SmgEventConverter
from tokenkeys.server.grpc.vllm_engine.stubs import common_pb2


def start_of(stream: EventStream, start: int) -> int | None:
    """Where to subscribe ``stream`` for ``start_sequence_number`` ``start``; None is live."""
    oldest = stream.oldest_seq
    if start == 0:
        return oldest if oldest == stream.first_seq else None
    if oldest <= start <= stream.next_seq:
        return start
    raise OutOfRange(
        f"start_sequence_number {start} is not kept: this stream holds batches {oldest} to "
        f"{stream.next_seq - 1} (the next is {stream.next_seq}); subscribe from 0",
        field="start_sequence_number",
    )


async def local_batches(stream: EventStream, start: int) -> AsyncIterator[tuple[int, EventBatch]]:
    """A hosted engine's batches from ``start`` (see the module doc)."""
    try:
        async for item in stream.subscribe(start_of(stream, start)):
            yield item
    except LimitExceeded as error:
        raise DataLoss(error.message, field="start_sequence_number") from None
    raise Unavailable("the server is stopping; subscribe again (to another instance)")


async def remote_batches(remote: RemoteEngine, start: int) -> AsyncIterator[tuple[int, EventBatch]]:
    """A remote OpenEngine engine's batches from ``start``, relayed."""
    codec = ProtobufEventCodec()
    request = kv_pb2.SubscribeKvEventsRequest(model=remote.model, start_sequence_number=start)
    try:
        async for message in remote.control.SubscribeKvEvents(request):
            if message.HasField("error"):
                raise Unavailable(
                    f"the remote engine {remote.target} ended its KV events: "
                    f"{message.error.message}; subscribe again"
                )
            yield codec.decode(message.batch)
    except grpc.RpcError as error:
        raise from_grpc(error) from None


async def smg_batches(
    batches: AsyncIterator[tuple[int, EventBatch]],
) -> AsyncIterator[common_pb2.KvEventBatch]:
    """``batches`` converted for one subscriber."""
    converter = SmgEventConverter()
    async for seq, batch in batches:
        yield converter.convert(seq, batch)
