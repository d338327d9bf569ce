"""EventStream: one sequence for every transport, replay from a start seq, slow subscribers."""

from __future__ import annotations

import asyncio

import pytest

from tokenkeys.errors import ConfigError, LimitExceeded
from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, EventBatch, SpecRef
from tokenkeys.events.stream import EventStream
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_publisher import ZmqEventPublisher

SPEC = SpecRef("vllm.sha256_cbor", "ab" * 32)


def batch(i: int) -> EventBatch:
    return EventBatch(float(i), (BlockRemoved((i,), "GPU"),))


async def take(agen, n):
    return [await agen.__anext__() for _ in range(n)]


async def test_batches_are_numbered_and_stamped():
    stream = EventStream(SPEC, data_parallel_rank=2)
    assert [stream.emit(batch(i)) for i in range(3)] == [0, 1, 2]
    got = await take(stream.subscribe(0), 3)
    assert [s for s, _ in got] == [0, 1, 2]
    assert all(b.spec == SPEC and b.data_parallel_rank == 2 for _, b in got)
    # A rank set by the producer is kept.
    stream.emit(EventBatch(9.0, (), data_parallel_rank=5))
    assert (await take(stream.subscribe(3), 1))[0][1].data_parallel_rank == 5


async def test_zmq_payloads_carry_the_same_batches_under_the_same_seq():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0") as pub:
        pub.publish(b"earlier batch from before the stream existed")
        stream = EventStream(SPEC, publisher=pub)
        assert stream.next_seq == 1
        for i in range(3):
            stream.emit(batch(i))
        in_process = await take(stream.subscribe(0), 3)
        buffered = pub.buffered()[1:]
        info = stream.source_info()
    assert info.endpoint == pub.endpoint and info.replay_endpoint == pub.replay_endpoint
    assert info.spec == SPEC and info.wire_format == "vllm-msgpack" and info.wire_version == "0.33"
    assert EventStream(SPEC).source_info() is None
    codec = VllmMsgpackCodec(spec=SPEC)
    assert [s for s, _ in in_process] == [s for s, _ in buffered] == [1, 2, 3]
    assert [codec.decode(p) for _, p in buffered] == [b for _, b in in_process]


async def test_live_subscription_then_backlog_and_oldest_available():
    stream = EventStream(SPEC, buffer_steps=3)
    for i in range(5):
        stream.emit(batch(i))
    live = stream.subscribe()
    pending = asyncio.ensure_future(live.__anext__())
    await asyncio.sleep(0)
    stream.emit(batch(5))
    assert (await pending)[0] == 5
    # start_seq older than the buffer: starts at the oldest kept batch (seq 3).
    assert [s for s, _ in await take(stream.subscribe(0), 3)] == [3, 4, 5]
    await live.aclose()
    # A start_seq not reached yet skips the batches before it.
    future = stream.subscribe(8)
    pending = asyncio.ensure_future(future.__anext__())
    await asyncio.sleep(0)
    for i in range(6, 9):
        stream.emit(batch(i))
    assert (await pending)[0] == 8


async def test_slow_subscriber_gets_its_backlog_then_limit_exceeded():
    stream = EventStream(SPEC, subscriber_backlog=2)
    sub = stream.subscribe()
    pending = asyncio.ensure_future(sub.__anext__())
    await asyncio.sleep(0)
    for i in range(4):
        stream.emit(batch(i))
    assert (await pending)[0] == 0
    assert (await sub.__anext__())[0] == 1
    with pytest.raises(LimitExceeded, match="resubscribe"):
        await sub.__anext__()


async def test_close_ends_subscriptions_after_pending_batches():
    stream = EventStream(SPEC)
    sub = stream.subscribe()
    pending = asyncio.ensure_future(sub.__anext__())
    await asyncio.sleep(0)
    stream.emit(EventBatch(1.0, (AllBlocksCleared(),)))
    stream.close()
    assert (await pending)[0] == 0
    with pytest.raises(StopAsyncIteration):
        await sub.__anext__()


def test_bad_configuration():
    with pytest.raises(ConfigError, match="buffer_steps"):
        EventStream(SPEC, buffer_steps=0)
