"""Dynamo's standalone KV indexer fed by tokenkeys' events agrees with tokenkeys' router.

Two simulated tokenkeys engines publish vLLM-wire KV events over ZMQ; a real ``dynamo.indexer``
(ai-dynamo-runtime 1.6.1, its own virtualenv) and tokenkeys' router both index them. For every
query, each worker's matched prefix in blocks must be equal in Dynamo, in tokenkeys' router and
in the engine itself: after stores, after eviction (a small cache), with LoRA adapters (Dynamo
seeds its hash with the adapter name; a ``cache_salt`` it does not read from the events, which
is pinned here as its behaviour), and across an engine restart on the same endpoints, after
which Dynamo must hold none of the old run's blocks and index the new run's (issue 22: a
sequence going back to 0 made it drop them; restart-safe sequence numbers and the run's opening
AllBlocksCleared are the remedy). Behind a relay that outlives the engine and cannot replay,
the opening clear is lost to ZMQ's slow joiner; the snapshot the engine publishes when the relay
joins again (``--kv-events-join-snapshot``) repairs it (issue 36). A plain ZMQ subscriber across
a restart is proven in tests/server/test_server_kv_restart.py.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest
from doc_blocks import parse_json_stream, run_shell, shell_block, swap_ports
from dynamo_agreement import (
    ADAPTER,
    BLOCK,
    SYSTEM,
    adapter_and_salted_stores,
    agree,
    held,
)
from dynamo_indexer import DynamoIndexer, matched_tokens
from ports import free_port
from router.routing_support import (
    Cluster,
    engine_config,
    engine_run,
    prompt_ids,
    start_cluster,
    wait_until,
)
from zmq_relay import LossyRelay

from tokenkeys.engine.config import SimulatedConfig
from tokenkeys.keys import KeyContext
from tokenkeys.router.workers.pool_setup import PoolSettings

pytestmark = pytest.mark.peers


@pytest.fixture
def settings(tmp_path: Path) -> PoolSettings:
    return PoolSettings(cache=tmp_path / "cache")


async def _indexer(python: Path, cluster: Cluster) -> DynamoIndexer:
    """Dynamo's indexer subscribed to every engine, each subscription attached: a batch
    published before is lost to ZMQ's slow joiner, and Dynamo learns of a loss only from a
    later batch, which a test's last store never has (the salted-store wait failed so)."""
    indexer = DynamoIndexer(python, BLOCK, cluster.stacks[0].models.names[0])
    indexer.wait_ready()
    parts = [stack.runtime.parts(stack.models.names[0]) for stack in cluster.stacks]
    joins = [p.publisher.stats.joins for p in parts]
    for i, part in enumerate(parts):
        source = part.zmq_source()
        indexer.register(i + 1, source.endpoint, source.replay_endpoint)
    await wait_until(
        lambda: all(p.publisher.stats.joins > n for p, n in zip(parts, joins, strict=True)),
        120.0,
        "Dynamo subscribed to every engine",
    )
    return indexer


async def _agree(cluster: Cluster, dynamo: DynamoIndexer, ids: list[int]) -> None:
    def matched(ids: list[int]) -> dict[int, int]:
        return {w: t // BLOCK for w, t in dynamo.matched_tokens(ids).items()}

    await agree(cluster, matched, ids, log=lambda: dynamo.log()[-1500:])


async def test_dynamo_indexer_agrees_with_the_router_over_stores_and_evictions(
    dynamo_python: Path, settings: PoolSettings
) -> None:
    configs = [engine_config(engine=SimulatedConfig(num_kv_blocks=24)), engine_config()]
    cluster = await start_cluster(2, settings=settings, configs=configs)
    dynamo = await _indexer(dynamo_python, cluster)
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
    dynamo = await _indexer(dynamo_python, cluster)
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


async def test_dynamo_indexer_behind_a_relay_that_outlives_the_engine_holds_nothing_stale(
    dynamo_python: Path, settings: PoolSettings
) -> None:
    """Engine 0 reaches Dynamo through a plain forwarding relay (a SUB and a PUB, no replay:
    what a Dynamo worker's live-only relay is) that stays up while the engine restarts. The
    relay's SUB reconnects after the new run published its opening AllBlocksCleared, so the
    clear itself is lost; the engine's publisher sees the relay join again and publishes its
    snapshot (``--kv-events-join-snapshot``), which the relay forwards: Dynamo drops the old
    run's blocks and indexes the new."""
    configs = [engine_config(kv_events_join_snapshot=True), engine_config()]
    cluster = await start_cluster(2, settings=settings, configs=configs)
    upstream = cluster.stacks[0].runtime.parts(cluster.stacks[0].models.names[0]).zmq_source()
    relay = LossyRelay(upstream.endpoint)  # drops nothing: a plain relay
    dynamo = DynamoIndexer(dynamo_python, BLOCK, cluster.stacks[0].models.names[0])
    try:
        dynamo.wait_ready()
        dynamo.register(1, relay.endpoint, None)  # no replay behind a relay
        direct = cluster.stacks[1].runtime.parts(cluster.stacks[1].models.names[0]).zmq_source()
        dynamo.register(2, direct.endpoint, direct.replay_endpoint)
        before = [prompt_ids(cluster, f"Relayed {n}. " + SYSTEM) for n in range(6)]
        for ids in before:
            await cluster.stacks[0].generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
        await _agree(cluster, dynamo, before[-1])
        await cluster.restart_engine(0)  # same endpoints; the relay stays connected
        after = [prompt_ids(cluster, f"Relayed after {n}. " + SYSTEM) for n in range(2)]
        for ids in after:
            await cluster.stacks[0].generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
        for ids in before + after:  # 0 stale blocks: the old run's prefixes match nothing
            await _agree(cluster, dynamo, ids)
        assert all(engine_run(cluster, ids, 0) > 0 for ids in after)
    finally:
        dynamo.close()
        await relay.close()
        await cluster.close()


async def test_dynamo_indexer_keeps_adapters_apart_and_reads_no_salt(
    dynamo_python: Path, settings: PoolSettings
) -> None:
    configs = [engine_config(engine=SimulatedConfig(lora_modules=(ADAPTER,))) for _ in range(2)]
    cluster = await start_cluster(2, settings=settings, configs=configs)
    dynamo = await _indexer(dynamo_python, cluster)
    try:
        ids, blocks = await adapter_and_salted_stores(cluster)

        def answers(**kw: str) -> dict[int, int]:
            return {w: t // BLOCK for w, t in dynamo.matched_tokens(ids, **kw).items()}

        # An adapter's blocks match only a query naming it (Dynamo seeds its hash with it).
        # Awaited: the engines publish from this event loop (see ``agree``).
        adapter = {"lora_name": ADAPTER.name}
        await wait_until(lambda: answers(**adapter) == {1: blocks}, 120.0, "the adapter's blocks")
        assert held(cluster, ids, 0, KeyContext()) == 0
        # Dynamo 1.6.1 reads no salt from vLLM's events (its salt is per registration,
        # ``additional_salt``): it indexes the salted blocks as plain ones, so a plain query
        # matches them and a salted query does not. docs/integrations.md warns of it; the
        # engines keep them apart.
        salted = "the salted blocks, as Dynamo indexes them"
        await wait_until(lambda: answers() == {2: blocks}, 120.0, salted)
        assert answers(cache_salt="tenant-7") == {}
        assert held(cluster, ids, 1, KeyContext()) == 0
        assert answers(lora_name=ADAPTER.name) == {1: blocks}
    finally:
        dynamo.close()
        await cluster.close()


async def test_the_docs_indexer_commands_run_as_written(
    dynamo_python: Path, settings: PoolSettings, tmp_path: Path
) -> None:
    # docs/integrations.md's block, as written, with its addresses made this test's: the
    # indexer's port a free one, the engine's event and replay endpoints a live engine's.
    cluster = await start_cluster(1, settings=settings)
    source = cluster.stacks[0].runtime.parts(cluster.stacks[0].models.names[0]).zmq_source()
    port = free_port()
    block = swap_ports(
        shell_block(
            "docs/integrations.md",
            "tests/peers/test_peers_dynamo_indexer.py::"
            "test_the_docs_indexer_commands_run_as_written",
        ),
        {8090: port},
    )
    for doc_endpoint, endpoint in (
        ("tcp://10.0.0.5:5557", source.endpoint),
        ("tcp://10.0.0.5:5558", source.replay_endpoint),
    ):
        assert doc_endpoint in block
        block = block.replace(doc_endpoint, endpoint)
    shims = tmp_path / "bin"
    shims.mkdir()
    # ``python`` is Dynamo's environment's (a script: a venv's python finds its environment
    # from the path it is started by, which a symlink elsewhere would not be).
    (shims / "python").write_text(f'#!/bin/sh\nexec {dynamo_python} "$@"\n')
    (shims / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    try:
        with run_shell(block, cwd=tmp_path, env=env, listens={"dynamo.indexer": [port]}) as ran:
            registered, answer = parse_json_stream(ran.stdout)
            assert registered == {"status": "ok"}
            assert matched_tokens(answer) == {}, answer  # nothing stored yet
            # The registration subscribed it to the engine: a stored prompt reaches its index.
            ids = list(range(1, 18))
            await cluster.stacks[0].generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
            query = {"token_ids": ids[:16], "model_name": "tiny"}

            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for _ in range(300):  # a safety net for event delivery, not a measurement
                    found = matched_tokens((await client.post("/query", json=query)).json())
                    if found == {1: 16}:
                        break
                    await asyncio.sleep(0.1)
            assert found == {1: 16}, ran.logs
    finally:
        await cluster.close()
