"""What only the Redis index does: replicas sharing one index, namespaces, expiry, and faults.

Runs against a real ``redis-server`` (see conftest.py); the fault tests start their own server
so that stopping it disturbs nobody else.
"""

from __future__ import annotations

import asyncio

import pytest
import redis

from tokenkeys.errors import ConfigError, FailedPrecondition, Unavailable
from tokenkeys.router.index.model import PrefixMatch
from tokenkeys.router.index.redis import MAX_SCRIPT_FILTER, RedisPrefixIndex
from tokenkeys.router.policy.scorer import score_workers

GPU = ("gpu",)


async def test_two_replicas_see_each_others_writes(redis_backend):
    first = redis_backend.new()
    second = redis_backend.replica(first)
    await first.add("w1", [1, 2, 3])
    await second.add("w2", [1, 2])
    await second.add("w1", [3, 4], "cpu")
    for index in (first, second):
        got = await index.lookup([1, 2, 3, 4])
        assert got == {
            "w1": PrefixMatch("w1", ((2, GPU), (1, ("cpu", "gpu")), (1, ("cpu",)))),
            "w2": PrefixMatch("w2", ((2, GPU),)),
        }
    await first.clear("w2")
    assert await second.workers() == {"w1"}


async def test_concurrent_updates_from_several_replicas_all_land(redis_backend):
    replicas = [redis_backend.new()]
    replicas += [redis_backend.replica(replicas[0]) for _ in range(3)]
    prompt = list(range(100, 400))

    async def feed(replica: RedisPrefixIndex, worker: str, upto: int) -> None:
        # Each worker's updates come from one replica in order; replicas interleave freely.
        for start in range(0, upto, 10):
            await replica.add(worker, prompt[start : min(start + 10, upto)])
        await replica.remove(worker, prompt[upto - 5 : upto])

    lengths = {f"w{i}": 50 + 60 * i for i in range(4)}
    await asyncio.gather(*(feed(replicas[i], w, n) for i, (w, n) in enumerate(lengths.items())))
    for replica in replicas:
        got = await replica.lookup(prompt)
        assert {w: m.blocks for w, m in got.items()} == {w: n - 5 for w, n in lengths.items()}


async def test_namespaces_separate_indexes_on_one_server(redis_backend):
    pool_a, pool_b = redis_backend.new(), redis_backend.new()
    await pool_a.add("w", [1, 2])
    assert await pool_b.lookup([1, 2]) == {} and await pool_b.workers() == frozenset()
    assert set(await pool_a.lookup([1, 2])) == {"w"}


async def test_ttl_expires_entries_that_no_event_refreshes(redis_backend):
    index = redis_backend.new(ttl=0.3)
    await index.add("w", [1, 2])
    raw = redis.Redis.from_url(redis_backend.url)
    try:
        prefix = f"{{{index.namespace}}}:"
        for key in (prefix + "b:1", prefix + "b:2", prefix + "w:w"):
            assert 0 < raw.pttl(key) <= 300
        assert raw.pttl(prefix + "workers") == -1  # pruned by workers() instead
    finally:
        raw.close()
    for _ in range(200):
        if await index.lookup([1, 2]) == {}:
            break
        await asyncio.sleep(0.05)
    assert await index.lookup([1, 2]) == {}
    assert await index.workers() == frozenset()


async def test_foreign_data_in_the_namespace_is_a_failed_precondition(redis_backend):
    index = redis_backend.new()
    raw = redis.Redis.from_url(redis_backend.url)
    try:
        raw.set(f"{{{index.namespace}}}:b:9", "not a hash")
    finally:
        raw.close()
    with pytest.raises(FailedPrecondition, match="another type") as info:
        await index.add("w", [9])
    assert info.value.field == "namespace"


@pytest.mark.parametrize(
    ("options", "field"),
    [({"namespace": ""}, "namespace"), ({"namespace": "a{b}"}, "namespace"), ({"ttl": 0}, "ttl")],
)
def test_bad_configuration_is_refused(options, field):
    with pytest.raises(ConfigError) as info:
        RedisPrefixIndex.from_url("redis://127.0.0.1:1", **options)
    assert info.value.field == field
    with pytest.raises(ConfigError, match="Redis URL"):
        RedisPrefixIndex.from_url("http://example.com")


async def test_redis_stopped_then_restarted_fails_with_unavailable_then_recovers(
    start_redis,
):
    server = start_redis()
    index = RedisPrefixIndex.from_url(server.url, namespace="fault", timeout=0.5)
    try:
        await index.add("w", [1, 2, 3])
        assert (await index.lookup([1, 2, 3]))["w"].blocks == 3
        server.stop()
        calls = [
            index.add("w", [4]),
            index.remove("w", [1]),
            index.clear("w"),
            index.lookup([1, 2, 3]),
            index.workers(),
        ]
        for call in calls:
            with pytest.raises(Unavailable, match="route by load") as info:
                await call
            assert info.value.details["backend"] == "redis"
        # Meanwhile a router routes by load: no matches, the least loaded worker first.
        try:
            matches = await index.lookup([1, 2, 3])
        except Unavailable:
            matches = {}
        ranked = score_workers(matches, 3, {"w": 4, "idle": 0})
        assert [s.worker for s in ranked] == ["idle", "w"]
        server.start()  # same port, empty: no persistence
        assert await index.lookup([1, 2, 3]) == {}  # reconnected; scripts reloaded
        await index.add("w", [1, 2, 3])  # re-ingestion rebuilds it
        assert (await index.lookup([1, 2, 3]))["w"].blocks == 3
        assert await index.workers() == {"w"}
    finally:
        await index.close()


@pytest.mark.parametrize("shards", [1, 8])
async def test_more_holders_than_one_script_takes_are_walked_in_groups(redis_backend, shards):
    """Over MAX_SCRIPT_FILTER holders of the first block: the sharded walk asks for them in
    groups, and every worker's run comes back whole or cut at its own last block."""
    index = redis_backend.new(shards=shards)
    keys = list(range(900, 940))
    names = [f"w{i:04d}" for i in range(MAX_SCRIPT_FILTER + 40)]
    for i, w in enumerate(names):  # one at a time: a thousand connections at once would time out
        await index.add(w, keys[: 1 + i % len(keys)])
    want = {w: PrefixMatch(w, ((1 + i % len(keys), GPU),)) for i, w in enumerate(names)}
    assert await index.lookup(keys) == want
    assert await index.lookup(keys, names[::3]) == {w: want[w] for w in names[::3]}


@pytest.mark.parametrize("shards", [1, 8])
async def test_writes_of_one_turn_go_together_in_the_order_they_were_made(
    redis_backend, monkeypatch, shards
):
    """Many workers' writes made in one turn of the event loop (a router's followers applying
    their batches at once) reach Redis as one pipeline, and apply in the order made: an add
    then a remove of the same block leaves it removed, a remove then an add leaves it held."""
    index = redis_backend.new(shards=shards)
    await index.add("w0", [1])  # the layout is settled; from here, count the pipelines
    pipelines = []
    batch = index._store.batch

    async def counted(op, calls):  # noqa: ANN001, ANN202
        pipelines.append(op)
        return await batch(op, calls)

    monkeypatch.setattr(index._store, "batch", counted)
    keys = list(range(10, 3010))  # more than one WRITE call's worth (CHUNK) on one shard
    writes = [index.add(f"w{i}", keys[: 100 * i]) for i in range(1, 31)]
    writes += [index.remove("w1", [10]), index.remove("w0", [1]), index.add("w0", [1])]
    await asyncio.gather(*writes)
    assert pipelines == ["write"]
    got = await index.lookup([1])
    assert set(got) == {"w0"}
    got = await index.lookup(keys)
    assert "w1" not in got  # its first block was removed after it was added
    assert {w: m.blocks for w, m in got.items()} == {f"w{i}": 100 * i for i in range(2, 31)}
    assert await index.workers() == {f"w{i}" for i in range(31)}
