"""A ZMQ subscriber that stays connected while its engine restarts ends in step with the new run.

Real sockets on loopback: a plain pyzmq SUB (no replay, no sequence tracking: the simplest
consumer of vLLM's wire) connects once to a served simulated engine's KV-event endpoint and
keeps an index of what the events say is cached. The engine stops and starts again on the same
ports with an empty cache, and publishes its run's opening ``AllBlocksCleared`` at once, while
the SUB is still reconnecting (ZMQ retries every 100 ms): ZMQ's slow joiner loses it. The
publisher (started with ``--kv-events-join-snapshot``) sees the SUB's subscription when it is
attached again and publishes the stream's
snapshot (``events.stream``), so the SUB's index ends equal to the new engine's cache, holding
none of the old run's blocks. Issue 36 measured 53 stale blocks in a consumer of this kind.
"""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio
from engine_stack import EngineStack, start_stack
from router.routing_support import engine_config

from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, BlockStored
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_publisher import ZmqEventPublisher

WAIT_S = 120.0  # a safety net for event delivery (generous: a loaded machine), never a criterion


def prompt(seed: int, blocks: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 30_000 + 200 for i in range(blocks * 16)]


def held(stack: EngineStack) -> set[int]:
    """The event keys of the blocks the engine's cache holds now."""
    cache = stack.local().engine.cache
    return {b.key.event_key for b in cache._blocks if b.key is not None}  # noqa: SLF001


class PlainSubscriber:
    """A SUB connected once, applying every batch it receives; never replays."""

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.index: set[int] = set()
        self.clears = 0
        self.codec = VllmMsgpackCodec()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            _, _, payload = await self.sock.recv_multipart()
            for event in self.codec.decode(payload).events:
                if isinstance(event, AllBlocksCleared):
                    self.index.clear()
                    self.clears += 1
                elif isinstance(event, BlockStored):
                    self.index.update(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    self.index.difference_update(event.block_hashes)

    async def wait_for(self, want: set[int], what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while self.index != want:
            assert loop.time() < deadline, (
                f"{what}: the subscriber holds {len(self.index - want)} blocks the engine does "
                f"not and lacks {len(want - self.index)}"
            )
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.sock.close(linger=0)


async def joined(publisher: ZmqEventPublisher) -> None:
    """Until the publisher has seen a subscription (the SUB is attached)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not publisher.stats.joins:
        assert loop.time() < deadline, "no subscriber joined"
        await asyncio.sleep(0.02)


async def generate(stack: EngineStack, tokens: list[int]) -> None:
    await stack.generate(
        token_ids=gen.TokenIds(ids=tokens), stopping=gen.StoppingOptions(max_tokens=1)
    )


async def test_a_subscriber_connected_across_a_restart_keeps_none_of_the_old_runs_blocks():
    config = engine_config(kv_events_join_snapshot=True)
    stack = await start_stack(config)
    parts = stack.runtime.parts(stack.models.names[0])
    sub = PlainSubscriber(parts.zmq_source().endpoint)
    try:
        await joined(parts.publisher)  # attached before the first run's requests
        for seed in range(4):
            await generate(stack, prompt(seed, 4))
        old = held(stack)
        await sub.wait_for(old, "before the restart")
        port = stack.port
        await stack.stop()
        stack = await start_stack(config, port=port)  # same ports, empty cache
        await sub.wait_for(set(), "after the restart, before any request")
        for seed in range(10, 12):
            await generate(stack, prompt(seed, 3))
        new = held(stack)
        await sub.wait_for(new, "after the new run's requests")
        assert new and not sub.index & old
        assert sub.clears >= 2  # each run's state reached it opening with a clear
    finally:
        await sub.close()
        await stack.stop()


async def test_joins_get_the_snapshot_and_consumers_in_step_stay_in_step():
    """A second subscriber joining publishes the snapshot to every subscriber: the first,
    already in step, applies it and is where it was; the newcomer is in step at once."""
    stack = await start_stack(engine_config(kv_events_join_snapshot=True))
    endpoint = stack.runtime.parts(stack.models.names[0]).zmq_source().endpoint
    first = PlainSubscriber(endpoint)
    second = None
    try:
        for seed in range(3):
            await generate(stack, prompt(seed, 4))
        cached = held(stack)
        await first.wait_for(cached, "the first subscriber")
        stream = stack.runtime.parts(stack.models.names[0]).stream
        joins = stream.join_snapshots
        second = PlainSubscriber(endpoint)
        await second.wait_for(cached, "the subscriber that joined after the requests")
        assert stream.join_snapshots > joins and first.index == cached
    finally:
        await first.close()
        if second is not None:
            await second.close()
        await stack.stop()
