"""Resynchronising one worker from its engine's snapshot, on request (issue 36, the building
block of the stale-worker repair).

A real cluster on loopback (simulated engines over gRPC, their ZMQ events, one router): the
router's index of a worker is made stale through the index's own API (a block the engine never
stored added, a block it holds removed: what a dropped batch leaves behind), then
``WorkerRegistry.resync`` clears the worker and rebuilds it from the engine's snapshot. The
index then agrees with the engine's cache again, the other worker is untouched, and the
resync is counted.
"""

from __future__ import annotations

from routing_support import counter, engine_run, index_run, prompt_ids, start_cluster, wait_until


async def test_a_stale_worker_is_rebuilt_from_its_snapshot_and_counted(settings):
    cluster = await start_cluster(2, settings=settings)
    try:
        prompts = [prompt_ids(cluster, "Resync. " + "A shared system prompt. " * 20)]
        prompts.append(prompt_ids(cluster, "Another prompt entirely. " * 20))
        for i, ids in enumerate(prompts):
            await cluster.stacks[i].generate(token_ids={"ids": ids}, stopping={"max_tokens": 1})
        await cluster.settle()
        pool = next(iter(cluster.registry.pools.values()))
        model = cluster.stacks[0].models.names[0]
        stale, other = cluster.addresses
        keys = await pool.block_keys(prompts[0])
        held = engine_run(cluster, prompts[0], 0)
        assert held > 2 and await index_run(cluster, prompts[0], stale) == held
        # Stale: the second block removed (the run is cut at 1), and a block the engine never
        # stored claimed (engine 1's first block, which engine 0 does not hold).
        worker = pool.index_id(stale)
        await cluster.index.remove(worker, [keys[1]])
        foreign = (await pool.block_keys(prompts[1]))[0]
        await cluster.index.add(worker, [foreign])
        assert await index_run(cluster, prompts[0], stale) == 1
        assert await index_run(cluster, prompts[1], stale) == 1  # an over-promise

        assert await cluster.registry.resync(stale, model, "test")
        await wait_until(
            lambda: _agrees(cluster, prompts, stale), what="the resynced worker's index"
        )
        assert await index_run(cluster, prompts[1], stale) == 0
        assert await index_run(cluster, prompts[1], other) == engine_run(cluster, prompts[1], 1)
        assert (
            counter(
                cluster, "tokenkeys_router_worker_resyncs_total", reason="test", source="snapshot"
            )
            == 1
        )
        assert counter(cluster, "tokenkeys_router_worker_clears_total", reason="resync") == 1
        # Followed on after the snapshot: a new prompt reaches the index.
        later = prompt_ids(cluster, "After the resync. " * 20)
        await cluster.stacks[0].generate(token_ids={"ids": later}, stopping={"max_tokens": 1})
        await cluster.settle()
        assert await index_run(cluster, later, stale) == engine_run(cluster, later, 0) > 0
        assert not await cluster.registry.resync("127.0.0.1:1", model, "test")  # not followed
    finally:
        await cluster.close()


async def _agrees(cluster, prompts, address) -> bool:  # noqa: ANN001
    return await index_run(cluster, prompts[0], address) == engine_run(cluster, prompts[0], 0)
