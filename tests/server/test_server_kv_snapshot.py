"""``OpenEngineKvSnapshot.GetKvSnapshot`` and ``GET /v1/kv/snapshot`` on a real served engine.

A real gRPC server and HTTP frontend on loopback over the simulated engine: the snapshot holds
exactly the blocks the engine's cache holds, valid at the stream's next sequence number, and a
subscription from there carries only what came after. ``SubscribeKvEvents`` with
``include_snapshot`` opens with the same snapshot and follows from its next number.
"""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from engine_stack import GrpcEvents, default_models

from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys._gen.openengine.v1 import kv_pb2, kv_snapshot_pb2, kv_snapshot_pb2_grpc
from tokenkeys.engine.config import EngineConfig, SimulatedConfig
from tokenkeys.events.model import AllBlocksCleared
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.server.assembly import EngineServer, ServeConfig

CODEC = ProtobufEventCodec()


def prompt(seed: int, blocks: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 30_000 + 200 for i in range(blocks * 16)]


@pytest.fixture
async def server():
    config = ServeConfig(
        host="127.0.0.1",
        grpc_port=0,
        http_port=0,
        engine=EngineConfig(engine=SimulatedConfig(num_kv_blocks=16)),
    )
    serving = await EngineServer(default_models(), config).start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{serving.grpc_port}")
    yield serving, channel
    await channel.close()
    await serving.stop()


async def generate(channel, tokens: list[int]) -> None:
    from tokenkeys._gen.openengine.v1 import openengine_pb2_grpc

    stub = openengine_pb2_grpc.InferenceStub(channel)
    request = gen.GenerateRequest(
        token_ids=gen.TokenIds(ids=tokens), stopping=gen.StoppingOptions(max_tokens=1)
    )
    async for _ in stub.Generate(request):
        pass


async def test_the_snapshot_holds_the_cached_blocks_and_where_the_stream_goes_on(server):
    serving, channel = server
    for seed in range(4):  # 4 x 5 blocks through a 16-block cache: some evicted
        await generate(channel, prompt(seed, 5))
    stub = kv_snapshot_pb2_grpc.OpenEngineKvSnapshotStub(channel)
    reply = await stub.GetKvSnapshot(kv_snapshot_pb2.GetKvSnapshotRequest())
    parts = serving.runtime.parts(serving.models.names[0])
    stream = parts.stream
    assert reply.next_sequence_number == stream.next_seq and reply.complete
    assert reply.batch.sequence_number == reply.next_sequence_number
    _, batch = CODEC.decode(reply.batch)
    assert isinstance(batch.events[0], AllBlocksCleared)
    snapshot_hashes = [e.block_hashes[0] for e in batch.events[1:]]
    # Exactly what the engine's cache holds (the events said so, the cache agrees).
    cache = parts.engine.engine.cache
    held = {b.key.event_key for b in cache._blocks if b.key is not None}  # noqa: SLF001
    assert 0 < len(snapshot_hashes) < 20 and set(snapshot_hashes) == held
    assert reply.batch.key_spec.spec_fingerprint == stream.spec.spec_fingerprint

    # Following from next_sequence_number: only what came after the snapshot.
    events = GrpcEvents(_Stack(channel), reply.next_sequence_number)
    try:
        await generate(channel, prompt(9, 2))
        (message,) = await events.batches(1)
        assert message.sequence_number == reply.next_sequence_number
    finally:
        events.cancel()

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{serving.http_port}") as client:
        body = (await client.get("/v1/kv/snapshot")).json()
        assert body["complete"] is True and body["next_sequence_number"] == stream.next_seq
        assert body["key_spec"]["spec_fingerprint"] == stream.spec.spec_fingerprint
        later = [e.block_hashes[0] for e in stream.snapshot().batch.events[1:]]
        assert [b["block_hash"] for b in body["blocks"]] == later
        first = body["blocks"][0]
        assert len(first["token_ids"]) == first["block_size"] == 16 and first["medium"] == "GPU"
        missing = await client.get("/v1/kv/snapshot", params={"model": "nope"})
        assert missing.status_code == 404 and "nope" in missing.text


async def test_an_unknown_model_is_not_found(server):
    _, channel = server
    stub = kv_snapshot_pb2_grpc.OpenEngineKvSnapshotStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetKvSnapshot(kv_snapshot_pb2.GetKvSnapshotRequest(model="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in info.value.details()


class _Stack:
    """What ``GrpcEvents`` needs of a stack: its Control stub."""

    def __init__(self, channel) -> None:
        from tokenkeys._gen.openengine.v1 import openengine_pb2_grpc

        self.control = openengine_pb2_grpc.ControlStub(channel)


def _held(serving) -> set[int]:
    """The event keys of the blocks the simulated engine's cache holds now."""
    cache = serving.runtime.parts(serving.models.names[0]).engine.engine.cache
    return {b.key.event_key for b in cache._blocks if b.key is not None}  # noqa: SLF001


def _apply(index: set[int], batch) -> None:
    """A consumer's index: what the events say is cached."""
    for event in batch.events:
        kind = event.WhichOneof("event")
        if kind == "all_blocks_cleared":
            index.clear()
        elif kind == "block_stored":
            index.update(int.from_bytes(h.value, "big") for h in event.block_stored.block_hashes)
        elif kind == "block_removed":
            index.difference_update(
                int.from_bytes(h.value, "big") for h in event.block_removed.block_hashes
            )


async def test_include_snapshot_opens_with_the_cache_then_follows_without_gap(server):
    """SubscribeKvEvents(include_snapshot): the snapshot numbered next - 1, then every batch
    from next on; a consumer applying them holds exactly the engine's cache, also while
    generation runs between the subscription and its reads (evictions included)."""
    serving, channel = server
    for seed in range(3):
        await generate(channel, prompt(seed, 5))
    stream = serving.runtime.parts(serving.models.names[0]).stream
    control = _Stack(channel).control
    call = control.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(include_snapshot=True))
    reader = call.__aiter__()
    first = await asyncio.wait_for(reader.__anext__(), 5)
    snapshot_seq = first.batch.sequence_number
    assert snapshot_seq == stream.next_seq - 1
    assert first.batch.events[0].WhichOneof("event") == "all_blocks_cleared"
    index: set[int] = set()
    _apply(index, first.batch)
    assert index == _held(serving) and len(index) == len(first.batch.events) - 1 > 0
    # More traffic than the cache holds (16 blocks): stores and evictions follow the snapshot.
    for seed in range(10, 14):
        await generate(channel, prompt(seed, 5))
    seqs = []
    while len(seqs) < stream.next_seq - snapshot_seq - 1:
        message = await asyncio.wait_for(reader.__anext__(), 5)
        seqs.append(message.batch.sequence_number)
        _apply(index, message.batch)
    call.cancel()
    assert seqs == list(range(snapshot_seq + 1, stream.next_seq))  # contiguous, nothing twice
    assert index == _held(serving)


async def test_include_snapshot_refusals(server):
    """With start_sequence_number (they decide the same thing): INVALID_ARGUMENT; a snapshot
    that may lack blocks (a relay that joined its publisher late): FAILED_PRECONDITION naming
    why."""
    serving, channel = server
    control = _Stack(channel).control
    both = kv_pb2.SubscribeKvEventsRequest(include_snapshot=True, start_sequence_number=3)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await control.SubscribeKvEvents(both).read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "start_sequence_number" in info.value.details()
    # The ledger of a relay that joined late says so (engine.vllm.snapshot_scope does this).
    ledger = serving.runtime.parts(serving.models.names[0]).stream.ledger
    ledger.joined(False, "batches 0-9 were published before this relay started")
    call = control.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(include_snapshot=True))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "batches 0-9" in info.value.details() and "GetKvSnapshot" in info.value.details()
