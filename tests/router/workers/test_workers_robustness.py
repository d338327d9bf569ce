"""Router robustness: a full Redis index, a worker lying about its load, a silent worker.

Real parts: simulated engines (``tokenkeys serve``'s engine side) on loopback gRPC and ZMQ, a
dedicated ``redis-server`` made full with ``maxmemory`` and ``noeviction``, the router's HTTP
app. Two parts are made to misbehave on purpose, because no real engine here does: the lying
engine's GetLoad answer (its ``load_info``) and the silent engine's event stream (its ``emit``).
The write backoff reads a test clock, so its periods pass without sleeping.
"""

from __future__ import annotations

import uuid

import httpx
import pytest
import redis as redis_client
from routing_support import (
    SYSTEM,
    Cluster,
    counter,
    index_agrees,
    prompt_ids,
    routed,
    start_cluster,
    wait_until,
)

from tokenkeys.router.index.redis import RedisPrefixIndex
from tokenkeys.server.runtime import discovery_messages

CLEARS = "tokenkeys_router_worker_clears_total"


class ManualClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _traffic(cluster: Cluster, tag: str, settle: bool) -> None:
    """One request straight to every engine: each stores blocks and publishes a batch."""
    for i, stack in enumerate(cluster.stacks):
        ids = prompt_ids(cluster, f"Traffic {tag} {i}. " * 30)
        await stack.generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
    if settle:  # ZMQ: a follower notices a batch only when a later one arrives
        await cluster.settle()


def _clears(cluster: Cluster, address: str) -> float:
    pool = next(iter(cluster.registry.pools.values()))
    return counter(cluster, CLEARS, worker=pool.index_id(address), reason="index_write_failed")


def _followers(cluster: Cluster) -> list:
    return [f for ws in cluster.registry.workers.values() for f in ws.followers.values()]


@pytest.mark.parametrize("transport", ["zmq", "grpc"])
async def test_a_full_redis_routes_by_load_with_backoff_and_recovers(
    settings, start_redis, transport
):
    server = start_redis()
    admin = redis_client.Redis(port=server.port)
    index = RedisPrefixIndex.from_url(server.url, namespace=f"t-{uuid.uuid4().hex[:12]}")
    cluster = await start_cluster(3, settings=settings, index=index, transport=transport)
    clock = ManualClock()
    backoff = cluster.registry.following.write_backoff
    backoff.clock, backoff.base, backoff.cap = clock, 10.0, 40.0
    zmq = transport == "zmq"
    try:
        first = prompt_ids(cluster, "Conversation one. " + SYSTEM)
        home = (await routed(cluster, first))[0].worker
        await cluster.settle()
        assert (await routed(cluster, first))[0].reason == "prefix"

        # Full: writes are refused (OOM), reads and deletes still work.
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        for n in range(3):  # several batches per worker inside one backoff period
            await _traffic(cluster, f"full {n}", settle=zmq)
        await wait_until(lambda: all(f.backoff.failing for f in _followers(cluster)), 20)
        # One clear per worker in the period, however many batches arrived (ZMQ drops them,
        # gRPC stops reading until the period is over).
        assert [_clears(cluster, a) for a in cluster.addresses] == [1, 1, 1]
        if zmq:
            assert counter(cluster, "tokenkeys_router_kv_batches_total", outcome="dropped") >= 3
        decision, usage = await routed(cluster, first)  # its entries are gone: by load
        assert decision.reason == "load" and usage.prompt_tokens > 0
        status = cluster.registry.status()
        writes = [e["index_writes"] for w in status["workers"] for e in w["events"].values()]
        assert all(w["failing"] and "is full" in w["error"] for w in writes)

        # The period passes, Redis is still full: the rebuild fails, one more clear, and the
        # next period is twice as long.
        clock.now += 10.0
        await _traffic(cluster, "retry", settle=zmq)
        await wait_until(lambda: all(_clears(cluster, a) == 2 for a in cluster.addresses), 20)
        assert all(f.backoff.delay == 20.0 for f in _followers(cluster))

        # Space returns; after the period every worker is rebuilt from its engine's buffer.
        admin.config_set("maxmemory", 0)
        clock.now += 20.0
        await _traffic(cluster, "space", settle=zmq)
        if zmq:  # the rebuild rewinds; the replay comes with the next batch
            await _traffic(cluster, "replay", settle=True)
        await wait_until(lambda: not any(f.backoff.failing for f in _followers(cluster)), 20)
        await wait_until(lambda: index_agrees(cluster, first, home), 20, "index rebuilt")
        decision, _ = await routed(cluster, first)
        assert decision.reason == "prefix"
        assert [_clears(cluster, a) for a in cluster.addresses] == [2, 2, 2]
    finally:
        await cluster.close()
        admin.close()


async def test_a_lying_and_a_silent_worker_are_flagged_with_reasons(settings, monkeypatch):
    cluster = await start_cluster(3, settings=settings, http=True)
    liar, mute = cluster.stacks[0], cluster.stacks[1]
    honest = discovery_messages.load_info

    async def lying_load(instance_id, engines):  # noqa: ANN001, ANN202
        info = await honest(instance_id, engines)
        if instance_id == liar.runtime.instance_id:  # claims to be idle, whatever runs there
            info.running_requests = info.queued_requests = 0
        return info

    monkeypatch.setattr(discovery_messages, "load_info", lying_load)
    mute.local().stream.emit = lambda batch: 0  # publishes nothing from now on
    cluster.registry.health.silent_after = 0.0
    held = []
    url = cluster.url
    try:
        pool = next(iter(cluster.registry.pools.values()))
        views = {a: pool.members[a].view for a in cluster.addresses}
        # Requests until the liar has one held open (in flight) and the mute one got one.
        for n in range(24):
            if views[liar.target].inflight and views[mute.target].last_sent is not None:
                break
            stream = cluster.engine().generate(prompt_ids(cluster, f"Question {n}. " * 20))
            await anext(stream)
            if views[liar.target].inflight > len(held):
                held.append(stream)
            else:
                async for _ in stream:
                    pass
        assert views[liar.target].inflight and views[mute.target].last_sent is not None
        await cluster.settle(ignore=(1,))  # the other workers' batches are applied

        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def suspects() -> dict[str, set[str]]:
                status = (await client.get("/router/workers")).json()
                return {
                    w["address"]: {x["reason"] for xs in w["suspect"].values() for x in xs}
                    for w in status["workers"]
                }

            want = {liar.target: {"load_underreported"}, mute.target: {"events_silent"}}
            await wait_until(
                lambda: _suspects_are(suspects, want, cluster.stacks[2].target), 20, "flags"
            )
            status = (await client.get("/router/workers")).json()
            by_address = {w["address"]: w for w in status["workers"]}
            (flag,) = next(iter(by_address[liar.target]["suspect"].values()))
            assert "in flight" in flag["message"]
            honest = cluster.stacks[2].target
            events = next(iter(by_address[honest]["events"].values()))
            # The honest worker shows a batch time once it was sent a request (the policy may
            # have sent it none; settle() above waited for whatever it published).
            assert "last_batch_applied_at" in events
            if views[honest].last_sent is not None:
                assert events["last_batch_applied_at"] is not None
            liar_id, mute_id = pool.index_id(liar.target), pool.index_id(mute.target)
            gauges = [
                f'tokenkeys_router_worker_suspect{{reason="load_underreported",worker="{liar_id}"}}'
                " 1.0",
                f'tokenkeys_router_worker_suspect{{reason="events_silent",worker="{mute_id}"}} 1.0',
                "tokenkeys_router_worker_last_event_batch_timestamp_seconds{",
            ]

            async def gauges_set() -> bool:  # by the health poll, not by the status view
                text = (await client.get("/metrics")).text
                return all(g in text for g in gauges)

            await wait_until(gauges_set, 20, "suspect gauges")

            # The status view only reads: with the poll stopped, a worker's new batch applied
            # and not yet taken by a poll, asking for the view twice changes neither the
            # gauges nor what the load views know of the workers' event batches.
            await cluster.registry.health.close()
            for n in range(12):
                sent = {a: v.last_sent for a, v in views.items()}
                async for _ in cluster.engine().generate(prompt_ids(cluster, f"Now {n}. " * 20)):
                    pass
                to = next(a for a, v in views.items() if v.last_sent != sent[a])
                if to != mute.target:
                    break
            assert to != mute.target
            await cluster.settle(ignore=(1,))  # the mute worker publishes nothing
            (follower,) = cluster.registry.workers[to].followers.values()
            await wait_until(
                lambda: (follower.applied_at or 0.0) >= views[to].last_sent, 10, "its batch"
            )
            assert views[to].waiting_since is not None  # what a poll would now clear

            async def state() -> tuple[list[str], dict]:
                text = (await client.get("/metrics")).text
                lines = [x for x in text.splitlines() if x.startswith("tokenkeys_router_worker")]
                return lines, _view_states(views)

            before = await state()
            for _ in range(2):
                assert (await client.get("/router/workers")).status_code == 200
            assert await state() == before
    finally:
        for stream in held:
            await stream.aclose()
        await cluster.close()


def _view_states(views: dict) -> dict:
    return {a: (v.waiting_since, v.last_sent, v.underreports) for a, v in views.items()}


async def _suspects_are(suspects, want, other) -> bool:  # noqa: ANN001
    found = await suspects()
    return all(found[a] == r for a, r in want.items()) and found[other] == set()
