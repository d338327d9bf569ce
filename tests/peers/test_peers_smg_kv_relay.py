"""smg-grpc-servicer 0.14.1's KV-event relay, its ``vllm-sha256-cbor`` hash check on, reads
tokenkeys' ZMQ stream and finds no mismatch: a second, independent check of our events.

The released relay (``kv_relay.relay``, the streaming ``SubscribeKvEvents`` of vLLM's
``--grpc`` server) runs as a real gRPC server in its own virtualenv over a simulated tokenkeys
engine's vLLM-wire ZMQ publisher; a real gRPC client subscribes. The relay rehashes every store
whose parent it knows (vLLM's ``sha256_cbor``, default seed, the cache salt folded in) and
counts the outcome; the counters asserted are the relay's own, reported as its stream closes.
The check is shown able to fail: a store whose last hash is off by one bit is counted as one
mismatch. And what the relay does when an engine restarts (its sequence jumps to the new run's
start, which no replay can fill): it ends the stream with ``DATA_LOSS`` by design, and smg's
gateway clears the worker and subscribes again from 0; the new stream checks the new run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import grpc
import pytest
from conftest import PeerDriver
from dynamo_agreement import SYSTEM
from router.routing_support import Cluster, engine_config, prompt_ids, start_cluster
from smg_kv_relay import Subscription

from tokenkeys.engine.config import SimulatedConfig
from tokenkeys.events.model import BlockStored, EventBatch
from tokenkeys.router.workers.pool_setup import PoolSettings

pytestmark = pytest.mark.peers

BLOCK = 16
U64 = 2**64


@pytest.fixture
def settings(tmp_path: Path) -> PoolSettings:
    return PoolSettings(cache=tmp_path / "cache")


def _subscribe(peer: PeerDriver, cluster: Cluster) -> Subscription:
    stack = cluster.stacks[0]
    source = stack.runtime.parts(stack.models.names[0]).zmq_source()
    return Subscription(peer, source.endpoint, source.replay_endpoint)


async def _generate(cluster: Cluster, ids: list[int], **kw: object) -> None:
    await cluster.stacks[0].generate(token_ids={"ids": ids}, stopping={"max_tokens": 1}, **kw)


async def _wait(predicate, what: str, timeout: float = 120.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout  # a safety net, not a measurement
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout:.0f} s"
        await asyncio.sleep(0.05)


async def _relaying(cluster: Cluster, sub: Subscription, tag: str) -> None:
    """Until the relay's SUB socket is connected: a ZMQ subscriber misses what was published
    before it joined, so fresh probe prompts go until one of them is forwarded."""
    for attempt in range(20):
        before = len(sub.stored_blocks())
        await _generate(cluster, prompt_ids(cluster, f"Probe {tag} {attempt}. " + SYSTEM)[:32])
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            if len(sub.stored_blocks()) > before:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the relay never forwarded a probe")


async def _workload(cluster: Cluster, tag: str) -> int:
    """Shared-prefix prompts and a salted one; how many blocks the engine stored."""
    total = 0
    for n in range(4):
        ids = prompt_ids(cluster, f"{tag} question {n}. " + SYSTEM)
        await _generate(cluster, ids)
        total += len(ids) // BLOCK
    salted = prompt_ids(cluster, f"{tag} salted. " + SYSTEM)
    await _generate(cluster, salted, kv={"cache_salt": "tenant-7"})
    return total + len(salted) // BLOCK


def _last(sub: Subscription) -> int:
    """The sequence number of the last batch the relay forwarded (-1: none yet)."""
    return sub.batches[-1].sequence_number if sub.batches else -1


def _all_checked(counts: dict, blocks: int) -> None:
    """The relay checked every block it forwarded and found each equal to vLLM's hash."""
    assert counts["hash_mismatch"] == 0, counts
    assert counts["hash_unverifiable"] == 0, counts
    assert counts["hash_checked"] == blocks > 0, counts


async def test_the_relays_hash_check_finds_no_mismatch_in_our_stream(
    smg_kv_relay_peer: PeerDriver, settings: PoolSettings
) -> None:
    configs = [engine_config(engine=SimulatedConfig(num_kv_blocks=40))]  # evicts, too
    cluster = await start_cluster(1, settings=settings, configs=configs)
    sub = _subscribe(smg_kv_relay_peer, cluster)
    try:
        await _relaying(cluster, sub, "a")
        await _workload(cluster, "A")
        await _workload(cluster, "B")
        await cluster.settle()
        await _wait(lambda: cluster.stacks[0].local().stream.next_seq - 1 <= _last(sub), "all")
    finally:
        (counts,) = sub.close()
        await cluster.close()
    _all_checked(counts, len(sub.stored_blocks()))
    assert counts["forwarded_removed"] > 0, counts  # the small cache evicted
    assert any(b.extra_keys for b in sub.stored_blocks())  # the salted blocks were checked


async def test_the_relays_hash_check_catches_a_corrupted_hash(
    smg_kv_relay_peer: PeerDriver, settings: PoolSettings
) -> None:
    cluster = await start_cluster(1, settings=settings)
    sub = _subscribe(smg_kv_relay_peer, cluster)
    try:
        await _relaying(cluster, sub, "c")
        ids = prompt_ids(cluster, "Corrupted. " + SYSTEM)
        await _generate(cluster, ids)
        await _wait(lambda: len(sub.stored_blocks()) >= 2 + len(ids) // BLOCK, "the prompt")
        genuine = [e.stored for b in sub.batches for e in b.events if e.HasField("stored")][-1]
        hashes = [block.block_hash % U64 for block in genuine.blocks]
        hashes[-1] ^= 1  # one bit off in the last block's hash
        parent = genuine.parent_block_hash % U64 if genuine.HasField("parent_block_hash") else None
        corrupted = BlockStored(
            block_hashes=tuple(hashes),
            parent_block_hash=parent,
            token_ids=tuple(t for block in genuine.blocks for t in block.token_ids),
            block_size=BLOCK,
        )
        blocks_before = len(sub.stored_blocks())
        stream = cluster.stacks[0].local().stream
        joins_before = stream.join_snapshots
        stream.emit(EventBatch(time.time(), (corrupted,)))
        await _wait(lambda: len(sub.stored_blocks()) > blocks_before, "the corrupted store")
    finally:
        (counts,) = sub.close()
        await cluster.close()
    # A subscriber joining after the corrupted store (the router's own, reconnecting) is answered
    # with the stream's snapshot, which names the corrupted block again: the relay may check it
    # once more per such snapshot, and finds no other block wrong.
    resent = stream.join_snapshots - joins_before
    assert 1 <= counts["hash_mismatch"] <= 1 + resent, (counts, resent)
    assert counts["hash_checked"] == len(sub.stored_blocks()), counts


async def test_after_an_engine_restart_the_relay_ends_with_data_loss_then_checks_the_new_run(
    smg_kv_relay_peer: PeerDriver, settings: PoolSettings
) -> None:
    cluster = await start_cluster(1, settings=settings)
    sub = _subscribe(smg_kv_relay_peer, cluster)
    try:
        await _relaying(cluster, sub, "before")
        await _workload(cluster, "Before")
        await cluster.settle()  # every batch of the first run forwarded before it is counted
        await _wait(lambda: cluster.stacks[0].local().stream.next_seq - 1 <= _last(sub), "all")
        first_run = len(sub.stored_blocks())
        await cluster.restart_engine(0)  # same ports; its sequence starts at the new run's
        for attempt in range(20):  # the relay's SUB reconnects: what it missed meanwhile is lost
            await _generate(cluster, prompt_ids(cluster, f"After restart {attempt}. " + SYSTEM))
            with contextlib.suppress(AssertionError):
                await _wait(lambda: sub.ended is not None, "the verdict", timeout=3.0)
                break
        # By design: the new run's numbers are far past the old cursor and the new publisher's
        # replay buffer does not hold the batches between, so the relay cannot vouch for the
        # stream; smg's gateway clears the worker and subscribes again from 0.
        assert sub.ended == grpc.StatusCode.DATA_LOSS, sub.details
        assert "replay" in sub.details, sub.details
        assert len(sub.stored_blocks()) == first_run  # nothing of the new run was forwarded
        sub.resubscribe()
        await _relaying(cluster, sub, "after")
        await _workload(cluster, "After")
        await cluster.settle()
        await _wait(lambda: cluster.stacks[0].local().stream.next_seq - 1 <= _last(sub), "all")
    finally:
        counts = sub.close()
        await cluster.close()
    assert [c["hash_mismatch"] for c in counts] == [0, 0], counts
    assert sum(c["hash_checked"] for c in counts) == len(sub.stored_blocks()), counts
    assert all(c["hash_unverifiable"] == 0 for c in counts), counts
