"""Dynamo's standalone KV indexer fed by tokenkeys' events agrees with tokenkeys' router.

Two simulated tokenkeys engines publish vLLM-wire KV events over ZMQ; a real ``dynamo.indexer``
(ai-dynamo-runtime 1.6.1, its own virtualenv) and tokenkeys' router both index them. For every
query, each worker's matched prefix in blocks must be equal in Dynamo, in tokenkeys' router and
in the engine itself: after stores, after eviction (a small cache), with LoRA adapters (Dynamo
seeds its hash with the adapter name; a ``cache_salt`` it does not read from the events, which
is pinned here as its behaviour), and across an engine restart on the same endpoints, after
which Dynamo must hold none of the old run's blocks and index the new run's (issue 22: a
sequence going back to 0 made it drop them; restart-safe sequence numbers and the run's opening
AllBlocksCleared are the remedy).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dynamo_indexer import DynamoIndexer
from router.routing_support import (
    Cluster,
    engine_config,
    engine_run,
    index_run,
    prompt_ids,
    start_cluster,
)

from tokenkeys.engine.config import LoraModule, SimulatedConfig
from tokenkeys.keys import Adapter, KeyContext, block_keys
from tokenkeys.router.workers.pool_setup import PoolSettings

pytestmark = pytest.mark.peers

BLOCK = 16  # the cluster's spec hash unit
SYSTEM = "You are a careful assistant. Answer in one short sentence, please. " * 12
ADAPTER = LoraModule("ada", "/adapters/ada", 1)


def _wait(predicate, what: str, timeout: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout:.0f} s"
        time.sleep(0.1)


@pytest.fixture
def settings(tmp_path: Path) -> PoolSettings:
    return PoolSettings(cache=tmp_path / "cache")


def _indexer(python: Path, cluster: Cluster) -> DynamoIndexer:
    indexer = DynamoIndexer(python, BLOCK, cluster.stacks[0].models.names[0])
    indexer.wait_ready()
    for i, stack in enumerate(cluster.stacks):
        source = stack.runtime.parts(stack.models.names[0]).zmq_source()
        indexer.register(i + 1, source.endpoint, source.replay_endpoint)
    return indexer


async def _agree(cluster: Cluster, dynamo: DynamoIndexer, ids: list[int], lora=None) -> None:
    """Dynamo's matched blocks per worker equal the router's and the engines' own."""
    await cluster.settle()
    want = {}
    for i, stack in enumerate(cluster.stacks):
        held = engine_run(cluster, ids, i) if lora is None else None
        routed = await index_run(cluster, ids, stack.target) if lora is None else None
        assert routed == held, (i, routed, held)
        if held:
            want[i + 1] = held
    seen: list[dict[int, int]] = []

    def matches() -> bool:
        seen.append({w: t // BLOCK for w, t in dynamo.matched_tokens(ids, lora).items()})
        return seen[-1] == want

    _wait(matches, f"Dynamo's matches {want} (it answers {seen[-1:]}; {dynamo.log()[-1500:]})")


async def test_dynamo_indexer_agrees_with_the_router_over_stores_and_evictions(
    dynamo_python: Path, settings: PoolSettings
) -> None:
    configs = [engine_config(engine=SimulatedConfig(num_kv_blocks=24)), engine_config()]
    cluster = await start_cluster(2, settings=settings, configs=configs)
    dynamo = _indexer(dynamo_python, cluster)
    try:
        prompts = [prompt_ids(cluster, f"Question {n}. " + SYSTEM) for n in range(8)]
        for n, ids in enumerate(prompts):
            stack = cluster.stacks[n % 2]
            await stack.generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
        for ids in prompts:  # engine 0 (24 blocks) evicted its oldest prompts' blocks
            await _agree(cluster, dynamo, ids)
        assert engine_run(cluster, prompts[0], 0) < len(prompts[0]) // BLOCK
    finally:
        dynamo.close()
        await cluster.close()


async def test_dynamo_indexer_holds_nothing_stale_after_an_engine_restart(
    dynamo_python: Path, settings: PoolSettings
) -> None:
    cluster = await start_cluster(2, settings=settings)
    dynamo = _indexer(dynamo_python, cluster)
    try:
        before = [prompt_ids(cluster, f"Before {n}. " + SYSTEM) for n in range(6)]
        for ids in before:
            await cluster.stacks[0].generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
        await _agree(cluster, dynamo, before[-1])
        await cluster.restart_engine(0)  # same gRPC and ZMQ ports, empty cache
        after = [prompt_ids(cluster, f"After {n}. " + SYSTEM) for n in range(2)]
        for ids in after:
            await cluster.stacks[0].generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
        for ids in before + after:  # old blocks gone everywhere, new ones indexed everywhere
            await _agree(cluster, dynamo, ids)
        assert all(engine_run(cluster, ids, 0) > 0 for ids in after)
    finally:
        dynamo.close()
        await cluster.close()


def _held(cluster: Cluster, ids: list[int], i: int, context: KeyContext) -> int:
    """The blocks engine ``i`` holds of ``ids`` under a key context (adapter, salt)."""
    local = cluster.stacks[i].local()
    return len(local.engine.cache.match_prefix(block_keys(ids, local.spec, context)))


async def test_dynamo_indexer_keeps_adapters_apart_and_reads_no_salt(
    dynamo_python: Path, settings: PoolSettings
) -> None:
    configs = [engine_config(engine=SimulatedConfig(lora_modules=(ADAPTER,))) for _ in range(2)]
    cluster = await start_cluster(2, settings=settings, configs=configs)
    dynamo = _indexer(dynamo_python, cluster)
    try:
        ids = prompt_ids(cluster, "Shared question. " + SYSTEM)
        adapter = KeyContext(adapter=Adapter(ADAPTER.name, ADAPTER.path))
        salted = KeyContext(cache_salt="tenant-7")
        await cluster.stacks[0].generate(
            token_ids={"ids": ids}, stopping={"max_tokens": 1}, lora_name=ADAPTER.name
        )
        await cluster.stacks[1].generate(
            token_ids={"ids": ids}, stopping={"max_tokens": 1}, kv={"cache_salt": "tenant-7"}
        )
        await cluster.settle()
        blocks = len(ids) // BLOCK
        assert _held(cluster, ids, 0, adapter) == blocks == _held(cluster, ids, 1, salted)

        def answers(**kw: str) -> dict[int, int]:
            return {w: t // BLOCK for w, t in dynamo.matched_tokens(ids, **kw).items()}

        # An adapter's blocks match only a query naming it (Dynamo seeds its hash with it).
        _wait(lambda: answers(lora_name=ADAPTER.name) == {1: blocks}, "the adapter's blocks")
        assert _held(cluster, ids, 0, KeyContext()) == 0
        # Dynamo 1.6.1 reads no salt from vLLM's events (its salt is per registration,
        # ``additional_salt``): it indexes the salted blocks as plain ones, so a plain query
        # matches them and a salted query does not. docs/integrations.md warns of it; the
        # engines keep them apart.
        _wait(lambda: answers() == {2: blocks}, "the salted blocks, as Dynamo indexes them")
        assert answers(cache_salt="tenant-7") == {}
        assert _held(cluster, ids, 1, KeyContext()) == 0
        assert answers(lora_name=ADAPTER.name) == {1: blocks}
    finally:
        dynamo.close()
        await cluster.close()
