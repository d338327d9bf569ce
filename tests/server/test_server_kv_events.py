"""KV events of a served engine over real gRPC and ZMQ: eviction order, reset, replay, the two
transports agreeing, and the terminal messages of SubscribeKvEvents.

Event timing reference: vLLM 0.33 (`vllm/v1/core/block_pool.py`, `vllm/distributed/kv_events.py`;
../shared/reference/engines/vllm.md §4.3): BlockRemoved one hash per event when a cached free
block is reallocated, least recently freed first, a request's blocks freed tail first;
AllBlocksCleared on a successful reset.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
import zmq
import zmq.asyncio
from engine_stack import GrpcEvents, start_stack, zmq_batches_until

from tokenkeys._gen.openengine.v1 import error_pb2, kv_pb2
from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys.engine.config import EngineConfig, SimulatedConfig
from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_publisher import END_SEQ
from tokenkeys.keys import block_keys

CODEC = ProtobufEventCodec()


def prompt(seed: int, blocks: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 30_000 + 200 for i in range(blocks * 16)]


async def run(stack, tokens: list[int], max_tokens: int = 1):
    return await stack.generate(
        token_ids=gen.TokenIds(ids=tokens), stopping=gen.StoppingOptions(max_tokens=max_tokens)
    )


async def grpc_events(stack, start: int | None = None) -> list[tuple[int, EventBatch]]:
    """Every batch from ``start`` (default: the run's first) to the newest, over
    SubscribeKvEvents."""
    if start is None:
        start = stack.local().stream.first_seq
    count = stack.local().stream.next_seq - start
    events = GrpcEvents(stack, start)
    try:
        return [CODEC.decode(b) for b in await events.batches(count)]
    finally:
        events.cancel()


def flat(batches) -> list:
    return [e for _, b in batches for e in b.events]


async def test_eviction_under_capacity_pressure_removes_least_recently_freed_blocks_first():
    stack = await start_stack(EngineConfig(engine=SimulatedConfig(num_kv_blocks=8)))
    try:
        a, b, c = prompt(1, 3), prompt(2, 3), prompt(3, 5)
        spec = stack.local().spec
        a_keys = [k.event_key for k in block_keys(a, spec)]
        b_keys = [k.event_key for k in block_keys(b, spec)]
        await run(stack, a)  # blocks 0-2, freed tail first: free queue ... a2 a1 a0
        await run(stack, b)  # takes the never-used blocks 3-5, freed b2 b1 b0
        await run(stack, c)  # needs 5: the 2 unused, then a2, a1, a0 (least recently freed)
        events = flat(await grpc_events(stack))
        removed = [e for e in events if isinstance(e, BlockRemoved)]
        assert [e.block_hashes for e in removed] == [(a_keys[2],), (a_keys[1],), (a_keys[0],)]
        # b is still cached (at most prompt - 1 tokens hit: 2 of its 3 blocks); a is gone.
        assert (await run(stack, b))[-1].usage.cached_prompt_tokens == 32
        assert (await run(stack, a))[-1].usage.cached_prompt_tokens == 0
        assert not {h for e in removed for h in e.block_hashes} & set(b_keys)
    finally:
        await stack.stop()


async def test_cache_reset_emits_all_blocks_cleared_on_both_transports():
    stack = await start_stack()
    try:
        tokens = prompt(4, 4)
        await run(stack, tokens)
        assert stack.local().engine.reset_prefix_cache() is True
        grpc_side = await grpc_events(stack)
        assert isinstance(grpc_side[-1][1].events[-1], AllBlocksCleared)
        zmq_side = await zmq_batches_until(stack, grpc_side[-1][0])
        assert zmq_side[-1][1].events == (AllBlocksCleared(),)
        assert (await run(stack, tokens))[-1].usage.cached_prompt_tokens == 0
    finally:
        await stack.stop()


async def test_grpc_and_zmq_streams_carry_the_same_batches_under_the_same_numbers():
    stack = await start_stack(EngineConfig(engine=SimulatedConfig(num_kv_blocks=12)))
    try:
        for i in range(6):
            await run(stack, prompt(10 + i % 3, 2 + i % 3), max_tokens=40)
        stack.local().engine.reset_prefix_cache()
        grpc_side = await grpc_events(stack)
        zmq_side = await zmq_batches_until(stack, grpc_side[-1][0])
        first = stack.local().stream.first_seq
        numbers = list(range(first, first + len(zmq_side)))
        assert [s for s, _ in grpc_side] == [s for s, _ in zmq_side] == numbers
        for (_, g), (_, z) in zip(grpc_side, zmq_side, strict=True):
            assert g.events == z.events
            assert g.ts == pytest.approx(z.ts, abs=1e-6)
            assert g.data_parallel_rank == z.data_parallel_rank == 0
        kinds = {type(e) for e in flat(grpc_side)}
        assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}
    finally:
        await stack.stop()


async def test_grpc_replay_returns_exactly_the_missed_batches_then_follows_live():
    stack = await start_stack()
    try:
        f = stack.local().stream.first_seq  # the run's AllBlocksCleared
        for i in range(3):
            await run(stack, prompt(20 + i, 2))
        first = GrpcEvents(stack, f)
        seen = await first.batches(4)
        first.cancel()
        assert [b.sequence_number for b in seen] == [f, f + 1, f + 2, f + 3]
        for i in range(4):  # missed while disconnected
            await run(stack, prompt(30 + i, 2))
        resumed = GrpcEvents(stack, f + 4)
        missed = await resumed.batches(4)
        assert [b.sequence_number for b in missed] == [f + 4, f + 5, f + 6, f + 7]
        everything = await grpc_events(stack)
        assert [CODEC.decode(b) for b in missed] == everything[4:]
        await run(stack, prompt(40, 2))  # then live
        (live,) = await resumed.batches(1)
        assert live.sequence_number == f + 8
        resumed.cancel()
    finally:
        await stack.stop()


async def _zmq_replay(endpoint: str, start: int) -> list[tuple[bytes, int, bytes]]:
    """A DEALER replay request as vLLM documents it; (topic, seq, payload) until the end marker."""
    ctx = zmq.asyncio.Context(shadow=zmq.Context.instance())
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    out = []
    try:
        await dealer.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            frames = await asyncio.wait_for(dealer.recv_multipart(), 5)
            _, topic, seq, payload = frames
            if seq == END_SEQ:
                return out
            out.append((topic, int.from_bytes(seq, "big"), payload))
    finally:
        dealer.close(linger=0)


async def test_zmq_replay_returns_exactly_the_batches_from_the_requested_sequence_number():
    stack = await start_stack()
    try:
        for i in range(5):
            await run(stack, prompt(50 + i, 2))
        info = stack.runtime.parts(stack.models.names[0]).zmq_source()
        f = stack.local().stream.first_seq  # then 5 batches: f + 1 .. f + 5
        replayed = await _zmq_replay(info.replay_endpoint, f + 3)
        assert [s for _, s, _ in replayed] == [f + 3, f + 4, f + 5]
        assert {t for t, _, _ in replayed} == {info.topic.encode()}
        decoded = [(s, VllmMsgpackCodec().decode(p)) for _, s, p in replayed]
        grpc_side = await grpc_events(stack, f + 3)
        assert [(s, b.events) for s, b in decoded] == [(s, b.events) for s, b in grpc_side]
    finally:
        await stack.stop()


async def test_subscriber_that_falls_behind_gets_a_terminal_overloaded_message():
    stack = await start_stack(EngineConfig(kv_events_subscriber_backlog=2))
    try:
        engine = stack.local().engine
        engine.reset_prefix_cache()
        events = GrpcEvents(stack, stack.local().stream.first_seq + 1)  # after the run's clear
        await events.batches(1)
        for _ in range(6):  # published back to back, faster than the subscriber is served
            engine.reset_prefix_cache()
        messages = []
        while True:
            message = await events.next()
            messages.append(message.WhichOneof("event"))
            if messages[-1] == "error":
                break
        assert messages == ["batch", "batch", "error"]
        assert message.error.code == error_pb2.ERROR_CODE_OVERLOADED
        assert message.error.retryable and "start_seq" in message.error.message
        with pytest.raises(StopAsyncIteration):
            await events.next()
    finally:
        await stack.stop()


async def test_stopping_server_ends_subscriptions_with_a_terminal_draining_message():
    stack = await start_stack()
    try:
        stack.local().engine.reset_prefix_cache()
        events = GrpcEvents(stack, stack.local().stream.first_seq + 1)  # after the run's clear
        await events.batches(1)  # the subscription is live: it delivered the batch before it
        stack.runtime.begin_shutdown()
        message = await events.next()
        assert message.WhichOneof("event") == "error"
        assert message.error.code == error_pb2.ERROR_CODE_DRAINING and message.error.retryable
    finally:
        await stack.stop()


@pytest.mark.parametrize(
    "request_fields,code,needle",
    [
        ({"data_parallel_ranks": [1]}, grpc.StatusCode.INVALID_ARGUMENT, "rank 0"),
        ({"model": "nope"}, grpc.StatusCode.NOT_FOUND, "smollm2"),
    ],
)
async def test_subscribe_refusals(request_fields, code, needle):
    stack = await start_stack()
    try:
        call = stack.control.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(**request_fields))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == code and needle in info.value.details()
    finally:
        await stack.stop()


async def test_without_zmq_the_grpc_stream_still_serves_events():
    stack = await start_stack(EngineConfig(kv_events=False))
    try:
        await run(stack, prompt(60, 2))
        (_, cleared), (seq, batch) = await grpc_events(stack)
        assert cleared.events == (AllBlocksCleared(),)  # every run starts so
        assert seq == stack.local().stream.first_seq + 1
        assert isinstance(batch.events[0], BlockStored)
        sources = await stack.control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
        assert [s.transport for s in sources.sources] == ["grpc"]
    finally:
        await stack.stop()


async def test_a_restarted_engine_numbers_above_its_last_run_and_opens_with_a_clear():
    """Restart-safe sequence numbers: a consumer that drops a regressing sequence (Dynamo's
    indexer) or ends on one (smg's relay) keeps the new run's batches, and the run's first
    batch clears what the last run stored."""
    first = await start_stack()
    try:
        for i in range(3):
            await run(first, prompt(70 + i, 2))
        last = first.local().stream.next_seq - 1
    finally:
        await first.stop()
    again = await start_stack()
    try:
        stream = again.local().stream
        assert stream.first_seq > last
        ((seq, opening),) = await grpc_events(again)
        assert seq == stream.first_seq and opening.events == (AllBlocksCleared(),)
        (zmq_seq, zmq_opening), *_ = await zmq_batches_until(again, seq)
        assert (zmq_seq, zmq_opening.events) == (seq, (AllBlocksCleared(),))
    finally:
        await again.stop()
