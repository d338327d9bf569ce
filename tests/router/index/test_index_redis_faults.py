"""A shared Redis index that stops and restarts empty under a live router and engines."""

from __future__ import annotations

import uuid

import pytest
from routing_support import (
    SYSTEM,
    counter,
    index_agrees,
    prompt_ids,
    routed,
    start_cluster,
    wait_until,
)

from tokenkeys.router.index.redis import RedisPrefixIndex


@pytest.mark.parametrize("transport", ["zmq", "grpc"])
async def test_routing_continues_by_load_without_redis_and_the_index_recovers(
    settings, start_redis, transport
):
    redis = start_redis()
    index = RedisPrefixIndex.from_url(redis.url, namespace=f"t-{uuid.uuid4().hex[:12]}")
    cluster = await start_cluster(3, settings=settings, index=index, transport=transport)
    try:
        first = prompt_ids(cluster, "Conversation one. " + SYSTEM)
        decision, _ = await routed(cluster, first)
        home = decision.worker
        await cluster.settle()
        again, usage = await routed(cluster, first)
        assert (again.worker, again.reason) == (home, "prefix") and usage.cached_prompt_tokens

        redis.stop()
        for _ in range(3):  # requests still succeed, routed by load
            decision, usage = await routed(cluster, first + prompt_ids(cluster, " more" * 20))
            assert decision.reason == "index_unavailable"
            assert usage.prompt_tokens > 0
        await wait_until(lambda: not cluster.registry.index_available, what="index down")
        decisions = "tokenkeys_router_decisions_total"
        assert counter(cluster, decisions, reason="index_unavailable") == 3

        redis.start()  # same port, empty: nothing it knew survived
        await wait_until(lambda: cluster.registry.index_available, what="index back")
        if transport == "zmq":
            # A ZMQ follower is cleared at its worker's next batch and asks for the replay at
            # the one after (a ZMQ subscriber replays when a live batch shows what it lacks).
            i = cluster.number(home)
            for n in range(2):
                await cluster.stacks[i].generate(
                    token_ids={"ids": prompt_ids(cluster, f"Traffic {n}. " * 30)},
                    stopping={"max_tokens": 1},
                )
                await cluster.settle()
        await cluster.settle()
        # Rebuilt from the engines' replay buffers: the index agrees with every engine again.
        await wait_until(lambda: index_agrees(cluster, first, home), what="index rebuilt")
        # (The requests routed by load meanwhile cached the prompt on other workers too, so
        # any holder of the whole prefix may win the tie now.)
        decision, usage = await routed(cluster, first)
        assert decision.reason == "prefix" and decision.matched_blocks == len(first) // 16
        assert usage.cached_prompt_tokens > 0
        clears = "tokenkeys_router_worker_clears_total"
        # Counted when the recovery's clears are applied, which may come after the index agrees.
        await wait_until(
            lambda: counter(cluster, clears, reason="index_recovered") >= 1, what="recovery counted"
        )
    finally:
        await cluster.close()
