"""Dynamo's ``KvRouter`` fed by tokenkeys' events agrees with tokenkeys' router.

The router proper of ai-dynamo-runtime 1.6.1 (its Python binding ``KvRouter`` and its
``get_overlap_scores``), not only its standalone indexer: each simulated tokenkeys engine is a
Dynamo worker whose ``KvEventPublisher`` relays the engine's vLLM-wire ZMQ stream onto Dynamo's
event plane, as Dynamo's own vLLM workers do (``drivers/dynamo_router_driver.py``: ``file``
discovery and the ``zmq`` event plane on loopback, so no etcd or NATS). For every query each
worker's device-tier matched blocks must equal tokenkeys' router's and the engine's own: after
stores, after eviction, across an engine restart on the same endpoint with its Dynamo worker
restarted too (no stale block, the new run's indexed), with LoRA adapters kept apart; and what
it makes of a ``cache_salt`` is pinned.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from conftest import PeerDriver
from dynamo_agreement import (
    ADAPTER,
    BLOCK,
    SYSTEM,
    adapter_and_salted_stores,
    agree,
    held,
    wait_for,
)
from router.routing_support import Cluster, engine_config, engine_run, prompt_ids, start_cluster

from tokenkeys.engine.config import SimulatedConfig
from tokenkeys.keys import KeyContext
from tokenkeys.router.workers.pool_setup import PoolSettings

pytestmark = pytest.mark.peers


@pytest.fixture
def settings(tmp_path: Path) -> PoolSettings:
    return PoolSettings(cache=tmp_path / "cache")


def _router(peer: PeerDriver, cluster: Cluster):  # noqa: ANN202 - a matched() function
    """Start one Dynamo worker per engine and the router; the router's matches, by worker."""
    endpoints = [
        stack.runtime.parts(stack.models.names[0]).zmq_source().endpoint for stack in cluster.stacks
    ]
    model = cluster.stacks[0].models.names[0]
    ids = peer.call("start", block_size=BLOCK, model=model, endpoints=endpoints)
    assert len(set(ids)) == len(endpoints)  # one Dynamo worker id per engine

    def matched(ids: list[int], **kw: str) -> dict[int, int]:
        answer = peer.call("overlap", token_ids=ids, **kw)
        return {int(i) + 1: blocks for i, blocks in answer.items()}

    return matched


async def _relaying(cluster: Cluster, matched, i: int) -> None:  # noqa: ANN001
    """Until engine ``i``'s Dynamo relay is subscribed: the relay is live-only, so a probe
    prompt's stores published before its subscriber connected are lost for good; a fresh
    probe is sent until one of them reaches the router."""
    for attempt in range(20):
        probe = prompt_ids(cluster, f"Probe {attempt} of engine {i}. " + SYSTEM)[: 2 * BLOCK]
        await cluster.stacks[i].generate(token_ids={"ids": probe}, stopping={"max_tokens": 1})
        await cluster.settle()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            if matched(probe).get(i + 1):
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"engine {i}'s Dynamo relay never delivered a probe")


async def test_kv_router_agrees_with_the_router_over_stores_and_evictions(
    dynamo_router_peer: PeerDriver, settings: PoolSettings
) -> None:
    configs = [engine_config(engine=SimulatedConfig(num_kv_blocks=24)), engine_config()]
    cluster = await start_cluster(2, settings=settings, configs=configs)
    try:
        matched = _router(dynamo_router_peer, cluster)
        for i in range(len(cluster.stacks)):
            await _relaying(cluster, matched, i)
        prompts = [prompt_ids(cluster, f"Question {n}. " + SYSTEM) for n in range(8)]
        for n, ids in enumerate(prompts):
            stack = cluster.stacks[n % 2]
            await stack.generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
        for ids in prompts:  # engine 0 (24 blocks) evicted its oldest prompts' blocks
            await agree(cluster, matched, ids)
        assert engine_run(cluster, prompts[0], 0) < len(prompts[0]) // BLOCK
    finally:
        await cluster.close()


async def test_kv_router_holds_nothing_stale_after_an_engine_and_its_worker_restart(
    dynamo_router_peer: PeerDriver, settings: PoolSettings
) -> None:
    """Dynamo's relay (``KvEventPublisher`` on a ZMQ endpoint) is live-only: it has no replay,
    so what an engine publishes while the relay's subscriber reconnects (a restarted engine's
    opening ``AllBlocksCleared`` and first stores) never reaches the router, and a relay kept
    across the restart leaves the old run's blocks indexed. Dynamo's own deployment restarts
    the worker with its engine (the vLLM worker process owns the relay), and so does this test:
    the old worker leaves the router's membership with its blocks, a new one relays the new
    run. (Dynamo's standalone indexer, which replays, needs no such step:
    test_peers_dynamo_indexer.py.)"""
    cluster = await start_cluster(2, settings=settings)
    try:
        matched = _router(dynamo_router_peer, cluster)
        for i in range(len(cluster.stacks)):
            await _relaying(cluster, matched, i)
        before = [prompt_ids(cluster, f"Before {n}. " + SYSTEM) for n in range(6)]
        for ids in before:
            await cluster.stacks[0].generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
        await agree(cluster, matched, before[-1])
        await cluster.restart_engine(0)  # same gRPC and ZMQ ports, empty cache
        dynamo_router_peer.call("restart", index=0)  # its Dynamo worker with it
        await _relaying(cluster, matched, 0)
        after = [prompt_ids(cluster, f"After {n}. " + SYSTEM) for n in range(2)]
        for ids in after:
            await cluster.stacks[0].generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
        for ids in before + after:  # old blocks gone everywhere, new ones indexed everywhere
            await agree(cluster, matched, ids)
        assert all(engine_run(cluster, ids, 0) > 0 for ids in after)
    finally:
        await cluster.close()


async def test_kv_router_keeps_adapters_apart_and_reads_no_salt(
    dynamo_router_peer: PeerDriver, settings: PoolSettings
) -> None:
    configs = [engine_config(engine=SimulatedConfig(lora_modules=(ADAPTER,))) for _ in range(2)]
    cluster = await start_cluster(2, settings=settings, configs=configs)
    try:
        matched = _router(dynamo_router_peer, cluster)
        for i in range(len(cluster.stacks)):
            await _relaying(cluster, matched, i)
        ids, blocks = await adapter_and_salted_stores(cluster)
        assert held(cluster, ids, 0, KeyContext()) == 0 == held(cluster, ids, 1, KeyContext())
        # An adapter's blocks match only a query naming it (Dynamo seeds its hash with it).
        wait_for(lambda: matched(ids, lora_name=ADAPTER.name) == {1: blocks}, "adapter blocks")
        # Like its indexer, Dynamo 1.6.1's router reads no salt from vLLM's events: its
        # relay indexes the salted blocks as plain ones, which a plain query then matches;
        # ``cache_namespace`` (its own per-request partition) does not reach them either.
        # docs/integrations.md warns of it; the engines keep them apart.
        wait_for(lambda: matched(ids) == {2: blocks}, "the salted blocks, as Dynamo indexes them")
        assert matched(ids, cache_namespace="tenant-7") == {}
        assert matched(ids, lora_name=ADAPTER.name) == {1: blocks}
    finally:
        await cluster.close()
