"""What Dynamo's readers (its standalone indexer, its ``KvRouter``) are checked against:
per worker, the matched prefix in blocks that tokenkeys' router and the engine itself hold.

A Dynamo reader is given as ``matched(ids) -> {worker number: blocks}`` (workers
numbered from 1 in cluster order, those matching nothing left out), so one agreement rule
serves every reader.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from router.routing_support import Cluster, engine_run, index_run, prompt_ids, wait_until

from tokenkeys.engine.config import LoraModule
from tokenkeys.keys import Adapter, KeyContext, block_keys

BLOCK = 16  # the cluster's spec hash unit
SYSTEM = "You are a careful assistant. Answer in one short sentence, please. " * 12
ADAPTER = LoraModule("ada", "/adapters/ada", 1)

Matched = Callable[[list[int]], dict[int, int]]


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Until ``predicate`` holds (a safety net for event delivery, not a measurement: generous,
    since the peers' processes share two cores with the real-engine tier's vLLM servers)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout:.0f} s"
        time.sleep(0.1)


async def settled(cluster: Cluster) -> None:
    """Every live engine ready at the router (one restarted in place is followed anew, or a
    new one joined: ``Cluster.settle`` skips a worker not ready), then every batch applied."""

    def all_ready() -> bool:
        live = [s for i, s in enumerate(cluster.stacks) if i not in cluster.stopped]
        workers = cluster.registry.workers
        return all(s.target in workers and workers[s.target].state == "ready" for s in live)

    await wait_until(all_ready, 120.0, "every live engine ready at the router")
    await cluster.settle()


async def agree(
    cluster: Cluster,
    matched: Matched,
    ids: list[int],
    log: Callable[[], str] = str,
) -> None:
    """The reader's matched blocks per worker equal the router's and the engines' own (``log``
    tells what the reader said, for a failure)."""
    await settled(cluster)
    want = {}
    for i, stack in enumerate(cluster.stacks):
        held = engine_run(cluster, ids, i)

        async def routed(target: str = stack.target, held: int = held) -> bool:
            return await index_run(cluster, ids, target) == held

        # Awaited too: a router that sees a worker restart after applying the new run's first
        # batches clears it and rebuilds it from its snapshot (it under-reports meanwhile).
        await wait_until(routed, 120.0, f"the router's index of engine {i} at {held} blocks")
        if held:
            want[i + 1] = held
    seen: list[dict[int, int]] = []

    def matches() -> bool:
        seen.append(matched(ids))
        return seen[-1] == want

    try:
        # Awaited, not slept: the engines and a relay in front of Dynamo run on this event
        # loop, and a blocking wait would keep them from publishing what Dynamo waits for.
        await wait_until(matches, 120.0, f"Dynamo's matches {want}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: it answers {seen[-1:]}; {log()}") from None


def held(cluster: Cluster, ids: list[int], i: int, context: KeyContext) -> int:
    """The blocks engine ``i`` holds of ``ids`` under a key context (adapter, salt)."""
    local = cluster.stacks[i].local()
    return len(local.engine.cache.match_prefix(block_keys(ids, local.spec, context)))


async def adapter_and_salted_stores(cluster: Cluster) -> tuple[list[int], int]:
    """One prompt stored under the adapter on engine 0 and under a cache salt on engine 1, each
    engine holding it whole in its own key space; the prompt's ids and its full blocks."""
    ids = prompt_ids(cluster, "Shared question. " + SYSTEM)
    adapter = KeyContext(adapter=Adapter(ADAPTER.name, ADAPTER.path))
    salted = KeyContext(cache_salt="tenant-7")
    await cluster.stacks[0].generate(
        token_ids={"ids": ids}, stopping={"max_tokens": 1}, lora_name=ADAPTER.name
    )
    await cluster.stacks[1].generate(
        token_ids={"ids": ids}, stopping={"max_tokens": 1}, kv={"cache_salt": "tenant-7"}
    )
    await settled(cluster)
    blocks = len(ids) // BLOCK
    assert held(cluster, ids, 0, adapter) == blocks == held(cluster, ids, 1, salted)
    return ids, blocks
