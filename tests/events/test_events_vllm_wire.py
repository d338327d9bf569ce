"""End to end over real ZMQ sockets: engine -> EventStream -> publisher -> independent subscriber.

The subscriber in this file is written from vLLM's documented wire format alone (vLLM 0.33
`vllm/distributed/kv_events.py`; ../shared/reference/engines/vllm.md §4.2-4.4): plain pyzmq and
msgpack, no tokenkeys code on the receiving side.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from dataclasses import dataclass

import msgpack
import zmq
import zmq.asyncio

from tokenkeys.engine.protocol import GenerationParams
from tokenkeys.engine.simulated.engine import SimulatedEngine
from tokenkeys.events.model import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    SpecRef,
)
from tokenkeys.events.stream import EventStream
from tokenkeys.events.zmq_publisher import ZmqEventPublisher
from tokenkeys.events.zmq_topic import make_topic

BS = 4
SPEC = SpecRef("test.standin-sha256", "0" * 64)


@dataclass(frozen=True)
class StandInKey:
    """TEST STAND-IN for ``tokenkeys.keys.BlockKey``; not a real cache-key profile."""

    digest: bytes
    event_key: int


def standin_block_keys(tokens, context=None):
    """TEST STAND-IN key function: sha256 chained over little-endian u32 token ids."""
    parent, out = b"\x00" * 32, []
    for start in range(0, len(tokens) - BS + 1, BS):
        h = hashlib.sha256(parent)
        h.update(b"".join(t.to_bytes(4, "little") for t in tokens[start : start + BS]))
        parent = h.digest()
        out.append(StandInKey(parent, int.from_bytes(parent[-8:], "big")))
    return out


# ----------------------------------------------------------------------------- the independent side

END = b"\xff" * 8
REQUIRED_STORED = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
)


class DocumentedSubscriber:
    """vLLM KV-event consumer from the documentation: SUB [topic, seq BE8, msgpack batch]."""

    def __init__(self, endpoint: str, replay_endpoint: str, topic: str) -> None:
        self.ctx = zmq.asyncio.Context(shadow=zmq.Context.instance())
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint

    async def recv(self, timeout: float = 5.0):
        topic, seq, payload = await asyncio.wait_for(self.sub.recv_multipart(), timeout)
        return topic.decode(), int.from_bytes(seq, "big"), payload

    async def replay(self, start: int):
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        await dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            _, topic, seq, payload = await asyncio.wait_for(dealer.recv_multipart(), 5)
            if seq == END:
                dealer.close(linger=0)
                return out
            out.append((topic.decode(), int.from_bytes(seq, "big"), payload))

    @staticmethod
    def decode(payload: bytes):
        ts, events, rank = msgpack.unpackb(payload, raw=False)
        assert isinstance(ts, float) and isinstance(rank, int)
        for ev in events:
            assert isinstance(ev, dict) and next(iter(ev)) == "type"
            if ev["type"] == "BlockStored":
                assert all(name in ev for name in REQUIRED_STORED)
                assert all(isinstance(h, int) and 0 <= h < 2**64 for h in ev["block_hashes"])
            elif ev["type"] == "BlockRemoved":
                assert "block_hashes" in ev and "medium" in ev and len(ev["block_hashes"]) == 1
            else:
                assert ev == {"type": "AllBlocksCleared"}
        return ts, events, rank

    def close(self) -> None:
        self.sub.close(linger=0)


def as_vllm_dict(event) -> dict:
    """What the documented map form says an event looks like (required keys, None omitted)."""
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    out = {"type": type(event).__name__}
    required = REQUIRED_STORED if isinstance(event, BlockStored) else ("block_hashes", "medium")
    for name, value in vars(event).items():
        if value is not None or name in required:
            out[name] = (
                [list(v) if isinstance(v, tuple) else v for v in value]
                if isinstance(value, tuple)
                else value
            )
    return out


# ----------------------------------------------------------------------------- the test


async def test_documented_subscriber_decodes_every_engine_event():
    publisher = ZmqEventPublisher(
        "tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
        topic=make_topic("127.0.0.1:8000", "test-model"),
    )
    await publisher.start()
    stream = EventStream(SPEC, publisher=publisher, data_parallel_rank=0)
    engine = SimulatedEngine(
        key_fn=standin_block_keys, block_size=BS, num_blocks=6, event_sink=stream
    )
    sub = DocumentedSubscriber(publisher.endpoint, publisher.replay_endpoint, "kv@")
    try:
        # Slow joiner: empty probe batches until the subscription is live.
        for _ in range(400):
            stream.emit(EventBatch(time.time(), ()))
            with contextlib.suppress(asyncio.TimeoutError):
                _, seq, _ = await sub.recv(0.05)
                while seq < stream.next_seq - 1:
                    _, seq, _ = await sub.recv()
                break
        first = stream.next_seq

        sent: list[tuple[int, EventBatch]] = []
        tap = stream.subscribe(first)
        prompts = [list(range(i * 100, i * 100 + 9)) for i in range(4)]
        for prompt in prompts + prompts[:1]:
            async for _ in engine.generate(prompt, GenerationParams(max_tokens=6)):
                pass
        assert engine.reset_prefix_cache()
        while len(sent) < stream.next_seq - first:
            sent.append(await tap.__anext__())
        await tap.aclose()

        received = [await sub.recv() for _ in sent]
        replayed = await sub.replay(first)
    finally:
        sub.close()
        await publisher.close()

    kinds = {type(e) for _, b in sent for e in b.events}
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}
    assert [seq for _, seq, _ in received] == [seq for seq, _ in sent]
    assert replayed == received
    for (seq, batch), (topic, r_seq, payload) in zip(sent, received, strict=True):
        assert topic == "kv@127.0.0.1:8000@test-model" and r_seq == seq
        ts, events, rank = DocumentedSubscriber.decode(payload)
        assert ts == batch.ts and rank == 0
        assert events == [as_vllm_dict(e) for e in batch.events]
        assert batch.spec == SPEC  # provenance rides beside the payload, not in it

    # The stored hashes are the key function's, block for block.
    stored = [e for _, b in sent for e in b.events if isinstance(e, BlockStored)]
    by_hash = {h for e in stored for h in e.block_hashes}
    for prompt in prompts:
        assert standin_block_keys(prompt)[0].event_key in by_hash
