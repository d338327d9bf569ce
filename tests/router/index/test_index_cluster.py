"""What only the index on a Redis Cluster does: sharding, any node as the URL, failover.

Runs against a real cluster of 3 masters with a replica each (``redis_cluster.py``); the index
conformance suite runs on it too (``test_router_index.py``, backend ``cluster``).
"""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest
import redis
from redis_cluster import drop_namespaces
from routing_support import SYSTEM, prompt_ids, routed, start_cluster

from tokenkeys.errors import FailedPrecondition, Unavailable
from tokenkeys.router.index.model import PrefixMatch
from tokenkeys.router.index.redis import CLUSTER_SHARDS, RedisPrefixIndex
from tokenkeys.router.workers.pool_setup import PoolSettings

GPU = ("gpu",)
CLIENT_SENT = ("evalsha", "eval", "hgetall", "get", "set")


def masters(url: str) -> list[redis.Redis]:
    client = redis.RedisCluster.from_url(url)
    try:
        return [redis.Redis(host=n.host, port=n.port) for n in client.get_primaries()]
    finally:
        client.close()


async def test_any_node_is_a_url_and_the_index_spreads_over_every_master(
    cluster_backend, redis_cluster
):
    index = cluster_backend.new()
    keys = list(range(1000, 1600))
    await index.add("w", keys)
    assert index.shards == CLUSTER_SHARDS
    for url in redis_cluster.urls():  # masters and replicas alike
        other = RedisPrefixIndex.from_url(url, namespace=index.namespace)
        cluster_backend.made.append(other)
        assert await other.lookup(keys) == {"w": PrefixMatch("w", ((600, GPU),))}
        assert other.shards == CLUSTER_SHARDS  # adopted from the namespace's layout record
    for node in masters(redis_cluster.url):
        try:
            held = [k for k in node.scan_iter(match=f"{{{index.namespace}#*:b:*", count=1000)]
            assert len(held) > 600 / 3 / 2  # about a third of the blocks each
            # redis-cli gives each master a third of the slots; the tags are spread evenly.
            assert len({k.split(b"}")[0] for k in held}) == CLUSTER_SHARDS // 3
        finally:
            node.close()


async def test_a_lookup_costs_a_script_call_per_shard_not_per_key(cluster_backend, redis_cluster):
    index = cluster_backend.new()
    keys = list(range(50_000, 52_000))
    await index.add("a", keys)
    await index.add("b", keys[:700])
    nodes = masters(redis_cluster.url)
    try:
        for node in nodes:
            node.config_resetstat()
        got = await index.lookup(keys)
        calls = 0
        for node in nodes:
            stats = node.info("commandstats")
            # Commands the scripts run count too: take only those a client sent.
            calls += sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in CLIENT_SENT)
    finally:
        for node in nodes:
            node.close()
    assert got == {"a": PrefixMatch("a", ((2000, GPU),)), "b": PrefixMatch("b", ((700, GPU),))}
    # One HGETALL for the first block, then at most one walk per shard.
    assert 2 <= calls <= 1 + CLUSTER_SHARDS


async def test_a_namespace_laid_out_otherwise_is_refused(cluster_backend):
    index = cluster_backend.new()
    await index.add("w", [1, 2])
    other = RedisPrefixIndex.from_url(cluster_backend.url, namespace=index.namespace, shards=8)
    cluster_backend.made.append(other)
    with pytest.raises(FailedPrecondition, match="shards=8") as info:
        await other.lookup([1, 2])
    assert info.value.field == "shards"


async def test_failover_during_routing_loses_no_index_writes(redis_cluster):
    """``CLUSTER FAILOVER`` on a replica while replicas write and look up: every write lands."""
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    writers = [RedisPrefixIndex.from_url(redis_cluster.url, namespace=namespace) for _ in range(2)]
    reader = RedisPrefixIndex.from_url(redis_cluster.urls()[-1], namespace=namespace)
    done = asyncio.Event()
    expected: dict[str, list[int]] = {}
    removed: list[int] = []
    # Each write's (start, end) and the failover's, on the loop's clock. The failover task runs
    # only while both writers wait inside a write, so some write overlaps it by construction;
    # the check below makes sure the test exercised that (not a timing of when writes return).
    writes: list[tuple[float, float]] = []
    failover: list[float] = []
    clock = asyncio.get_running_loop().time
    unavailable = 0

    async def write(index: RedisPrefixIndex, worker: str, base: int) -> None:
        keys = expected.setdefault(worker, [])
        step = 0
        while not done.is_set() or step < 40:
            chunk = list(range(base + step * 16, base + step * 16 + 16))
            started = clock()
            await index.add(worker, chunk)  # must not fail: redirected, retried
            writes.append((started, clock()))
            keys.extend(chunk)
            if step % 5 == 4:
                started = clock()
                await index.remove(worker, chunk[-2:])
                writes.append((started, clock()))
                removed.extend(keys[-2:])
                del keys[-2:]
            step += 1

    async def look() -> None:
        nonlocal unavailable
        while not done.is_set():
            try:
                await reader.lookup(expected.get("w0", [])[:64] or [0])
            except Unavailable:
                unavailable += 1  # a router routes by load for that request
            await asyncio.sleep(0)

    async def fail_over() -> None:
        try:
            await asyncio.sleep(0.2)
            failover.append(clock())
            replica = redis_cluster.replicas()[0]
            await asyncio.to_thread(redis_cluster.failover, replica)
            assert replica not in redis_cluster.replicas()
        finally:
            failover.append(clock())
            done.set()

    try:
        await asyncio.gather(
            write(writers[0], "w0", 0),
            write(writers[1], "w1", 10_000_000),
            look(),
            fail_over(),
        )
        assert set(expected) == {"w0", "w1"} and all(len(k) > 100 for k in expected.values())
        began, ended = failover
        assert any(s <= ended and e >= began for s, e in writes)  # writes during the failover
        for index in (*writers, reader):
            assert await index.workers() == {"w0", "w1"}
            for worker, keys in expected.items():
                # Every write is there, in order, and nothing removed came back.
                held = sorted(keys)
                got = await index.lookup(held, workers=[worker])
                assert got[worker].blocks == len(held), worker
            for key in removed:  # nothing removed came back
                assert await index.lookup([key]) == {}
        # The worker sets match the blocks: a clear leaves nothing of the worker behind.
        await writers[0].clear("w0")
        assert await reader.workers() == {"w1"}
        assert await reader.lookup(expected["w0"][:10]) == {}
    finally:
        for index in (*writers, reader):
            await index.close()
        drop_namespaces(redis_cluster.url, [namespace])


async def test_a_router_on_the_cluster_routes_by_prefix_through_any_node(tmp_path, redis_cluster):
    # The URL names the last node, whichever slots (if any) it serves.
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    index = RedisPrefixIndex.from_url(redis_cluster.urls()[-1], namespace=namespace)
    cluster = await start_cluster(3, settings=PoolSettings(cache=tmp_path / "c"), index=index)
    try:
        first = prompt_ids(cluster, "Conversation one. " + SYSTEM)
        decision, _ = await routed(cluster, first)
        await cluster.settle()
        again, usage = await routed(cluster, first)
        assert (again.worker, again.reason) == (decision.worker, "prefix")
        assert usage.cached_prompt_tokens > 0
    finally:
        await cluster.close()
        drop_namespaces(redis_cluster.url, [namespace])


async def test_a_lookup_agrees_with_the_memory_index_on_tiers_holes_and_filters(cluster_backend):
    """Random runs with tier changes and holes, spread over every shard: the runs joined from
    the shards' walks equal the memory index's, with and without a filter."""
    from tokenkeys.router.index.memory import MemoryPrefixIndex

    rng = random.Random(26)
    index, memory = cluster_backend.new(), MemoryPrefixIndex()
    keys = [rng.getrandbits(64) for _ in range(3_000)]
    for w in range(12):
        held = keys[: rng.randrange(1, len(keys))]
        for tier in ("gpu", "cpu"):
            part = [k for k in held if rng.random() < (0.97 if tier == "gpu" else 0.02)]
            for target in (index, memory):
                await target.add(f"w{w}", part, tier)
    for workers in (None, ["w1", "w3", "w5", "nobody"]):
        for prompt in (keys, keys[:700], keys[1:]):
            assert await index.lookup(prompt, workers) == await memory.lookup(prompt, workers)
