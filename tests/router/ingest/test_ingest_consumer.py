"""One worker's KV events over real ZMQ sockets into the prefix index, faults included.

A real :class:`ZmqEventPublisher` (vLLM 0.33 framing and replay) publishes vLLM-encoded batches;
a real :class:`ZmqEventSubscriber` feeds :class:`ZmqEventConsumer`. After each scenario the
index must equal an oracle: the same batches applied in order, directly, to a fresh index.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from zmq_relay import LossyRelay

from tokenkeys.errors import Unavailable
from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, SpecRef
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_publisher import ZmqEventPublisher
from tokenkeys.events.zmq_subscriber import ZmqEventSubscriber
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.index.redis import RedisPrefixIndex
from tokenkeys.router.ingest.consumer import ZmqEventConsumer
from tokenkeys.router.ingest.ingestor import EventIngestor

SPEC = SpecRef("vllm/sha256_cbor@0.31", "c" * 64)
FOREIGN = SpecRef("vllm/sha256_cbor@0.31", "d" * 64)
TOPIC = "kv@127.0.0.1:8000@test-model"
WORKER = "127.0.0.1:8000"
PROMPTS = [[101, 102, 103, 104, 105, 106], [201, 202, 203], [301, 302]]


def stored(*hashes: int, medium: str = "GPU") -> BlockStored:
    return BlockStored(hashes, None, tuple(range(16 * len(hashes))), 16, medium=medium)


def removed(*hashes: int, medium: str = "GPU") -> BlockRemoved:
    return BlockRemoved(hashes, medium)


def engine_steps() -> list[tuple]:
    """A little engine history: prefills, evictions, offload to CPU, a reset."""
    return [
        (stored(101, 102, 103),),
        (stored(104, 105, 106),),
        (removed(106),),
        (stored(101, 102, medium="CPU"), removed(102)),
        (stored(201, 202),),
        (AllBlocksCleared(), stored(301, 302)),
        (stored(101, 102, 103, 104),),
        (removed(104), stored(201, 202, 203)),
    ]


class Engine:
    """Publishes batches the way the simulated engine does: vLLM msgpack over ZMQ PUB."""

    def __init__(self, publisher: ZmqEventPublisher) -> None:
        self.publisher = publisher
        self.codec = VllmMsgpackCodec()
        self.sent: list[EventBatch] = []

    def step(self, *events) -> int:
        batch = EventBatch(time.time(), events, 0)
        self.sent.append(batch)
        return self.publisher.publish(self.codec.encode(batch))


async def settle(engine: Engine, consumer: ZmqEventConsumer) -> None:
    """Publish empty steps until the consumer has handled all that was published."""
    for _ in range(1000):
        target = engine.step()
        for _ in range(10):
            if consumer.last_seq is not None and consumer.last_seq >= target:
                return
            await asyncio.sleep(0.005)
    raise AssertionError(f"consumer stuck at {consumer.last_seq}")


async def oracle(batches: list[EventBatch]) -> MemoryPrefixIndex:
    index = MemoryPrefixIndex()
    ingestor = EventIngestor(index, SPEC)
    for b in batches:
        await ingestor.apply(WORKER, EventBatch(b.ts, b.events, 0, SPEC))
    return index


async def assert_same(index: PrefixIndex, expected: PrefixIndex) -> None:
    for prompt in PROMPTS:
        assert await index.lookup(prompt) == await expected.lookup(prompt), prompt
    assert await index.workers() == await expected.workers()


@contextlib.asynccontextmanager
async def running(consumer: ZmqEventConsumer):
    task = asyncio.ensure_future(consumer.run())
    try:
        yield consumer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.subscriber.close()


def make_consumer(endpoint, replay, index, *, source_spec=SPEC) -> ZmqEventConsumer:
    subscriber = ZmqEventSubscriber(endpoint, replay_endpoint=replay, start_seq=0, replay_timeout=5)
    return ZmqEventConsumer(
        WORKER, subscriber, VllmMsgpackCodec(spec=source_spec), EventIngestor(index, SPEC)
    )


def sample(consumer: ZmqEventConsumer, name: str, **labels) -> float:
    labels.setdefault("worker", WORKER)
    return consumer.ingestor.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_events_published_before_and_after_connecting_all_land_in_order():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC) as pub:
        engine = Engine(pub)
        steps = engine_steps()
        for events in steps[:3]:  # before the router subscribes: caught up by replay
            engine.step(*events)
        index = MemoryPrefixIndex()
        consumer = make_consumer(pub.endpoint, pub.replay_endpoint, index)
        async with running(consumer):
            for events in steps[3:]:
                engine.step(*events)
            await settle(engine, consumer)
        await assert_same(index, await oracle(engine.sent))
        assert (await index.lookup(PROMPTS[0]))[WORKER].blocks == 3  # 104 was evicted


async def test_an_idle_engine_s_events_from_before_the_subscription_land_without_a_later_batch():
    # Nothing is published once the router follows: the index must still get every batch
    # (the subscriber catches up when its connection is made, not at a next live batch).
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC) as pub:
        engine = Engine(pub)
        for events in engine_steps():
            engine.step(*events)
        last = pub.next_seq - 1
        index = MemoryPrefixIndex()
        consumer = make_consumer(pub.endpoint, pub.replay_endpoint, index)
        async with running(consumer):
            for _ in range(3000):  # a safety net, never a criterion: no batch is sent meanwhile
                if consumer.last_seq == last:
                    break
                await asyncio.sleep(0.01)
            assert consumer.last_seq == last and pub.next_seq == last + 1
        await assert_same(index, await oracle(engine.sent))


async def test_a_sequence_gap_is_replayed_and_the_index_is_correct():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC) as pub:
        relay = LossyRelay(pub.endpoint)
        engine = Engine(pub)
        index = MemoryPrefixIndex()
        consumer = make_consumer(relay.endpoint, pub.replay_endpoint, index)
        try:
            async with running(consumer):
                await settle(engine, consumer)
                base = pub.next_seq
                # Lose an eviction and a store on the way: without replay the index would keep
                # 106 and miss 201-202.
                relay.drop = {base + 2, base + 4}
                for events in engine_steps():
                    engine.step(*events)
                await settle(engine, consumer)
        finally:
            await relay.close()
        assert consumer.subscriber.stats.replayed >= 2 and consumer.subscriber.stats.lost == 0
        await assert_same(index, await oracle(engine.sent))
        assert sample(consumer, "tokenkeys_router_worker_clears_total", reason="events_lost") == 0


async def test_an_engine_restart_clears_the_worker():
    first = ZmqEventPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC)
    await first.start()
    endpoints = (first.endpoint, first.replay_endpoint)
    index = MemoryPrefixIndex()
    await index.add("other-worker", [101])
    consumer = make_consumer(*endpoints, index)
    async with running(consumer):
        engine = Engine(first)
        for events in engine_steps()[:2]:
            engine.step(*events)
        for _ in range(30):  # a long first run, so the restart's seq 0 is clearly behind
            engine.step()
        await settle(engine, consumer)
        assert (await index.lookup(PROMPTS[0]))[WORKER].blocks == 6
        await first.close()
        consumer.last_seq = None  # settle() below waits for the new run's numbers
        second = ZmqEventPublisher(*endpoints[:1], replay_endpoint=endpoints[1], topic=TOPIC)
        for _ in range(200):  # ZMQ releases the closed sockets' ports in its I/O thread
            try:
                await second.start()
                break
            except Unavailable:
                await asyncio.sleep(0.02)
        async with second:
            engine = Engine(second)
            engine.step(stored(301, 302))
            await settle(engine, consumer)
    assert sample(consumer, "tokenkeys_router_worker_clears_total", reason="publisher_restart") == 1
    await assert_same(index, await _with_other(await oracle(engine.sent)))


async def _with_other(index: MemoryPrefixIndex) -> MemoryPrefixIndex:
    await index.add("other-worker", [101])
    return index


async def test_events_of_a_foreign_spec_are_ignored_and_counted():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC) as pub:
        engine = Engine(pub)
        index = MemoryPrefixIndex()
        # The source advertises another spec fingerprint than the pool's.
        consumer = make_consumer(pub.endpoint, pub.replay_endpoint, index, source_spec=FOREIGN)
        async with running(consumer):
            for events in engine_steps():
                engine.step(*events)
            await settle(engine, consumer)
    events = sum(len(s) for s in engine_steps())
    assert await index.workers() == frozenset()
    ignored = sample(consumer, "tokenkeys_router_kv_events_ignored_total", reason="foreign_spec")
    assert ignored == events
    assert sample(consumer, "tokenkeys_router_kv_batches_total", outcome="applied") == 0


async def test_an_undecodable_payload_clears_the_worker():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC) as pub:
        engine = Engine(pub)
        index = MemoryPrefixIndex()
        consumer = make_consumer(pub.endpoint, pub.replay_endpoint, index)
        async with running(consumer):
            engine.step(stored(101, 102))
            await settle(engine, consumer)
            pub.publish(b"\xc1 not msgpack")
            engine.step(stored(201))
            await settle(engine, consumer)
    assert sample(consumer, "tokenkeys_router_worker_clears_total", reason="undecodable") == 1
    assert await index.lookup(PROMPTS[0]) == {}
    assert set(await index.lookup(PROMPTS[1])) == {WORKER}


async def test_redis_down_then_back_rebuilds_the_worker_from_replay(start_redis):
    server = start_redis()
    index = RedisPrefixIndex.from_url(server.url, namespace="consumer-fault", timeout=0.5)
    try:
        async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC) as pub:
            engine = Engine(pub)
            consumer = make_consumer(pub.endpoint, pub.replay_endpoint, index)
            steps = engine_steps()
            async with running(consumer):
                for events in steps[:3]:
                    engine.step(*events)
                await settle(engine, consumer)
                await assert_same(index, await oracle(engine.sent))
                server.stop()
                for events in steps[3:6]:  # applied nowhere: Redis is down
                    engine.step(*events)
                await settle(engine, consumer)
                assert consumer.resyncing
                server.start()  # empty again
                # What the registry does when its poll finds the index answering again (the
                # write backoff would otherwise delay the rebuild, see ingest/backoff.py).
                consumer.rebuild()
                for events in steps[6:]:
                    engine.step(*events)
                await settle(engine, consumer)  # reset, rewind ...
                await settle(engine, consumer)  # ... and the replay from seq 0
                assert not consumer.resyncing
            await assert_same(index, await oracle(engine.sent))
        assert (
            sample(consumer, "tokenkeys_router_worker_clears_total", reason="index_recovered") == 1
        )
        assert sample(consumer, "tokenkeys_router_kv_batches_total", outcome="failed") == 1
        assert sample(consumer, "tokenkeys_router_kv_batches_total", outcome="dropped") >= 1
    finally:
        await index.close()
