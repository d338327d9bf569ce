"""A router started after the engines served: it loads their snapshots, then follows.

Real engines (simulated, gRPC and ZMQ on loopback) with a replay buffer of 2 batches, so what
they stored early is no longer replayable when the late router joins: only the snapshot
(``OpenEngineKvSnapshot.GetKvSnapshot``) tells it where the prefix is cached.
"""

from __future__ import annotations

import pytest
from routing_support import SYSTEM, engine_config, prompt_ids, routed, start_cluster, wait_until

from tokenkeys.router.assembly import RouterProcess, RouterProcessConfig
from tokenkeys.router.routed_engine import RouteNote, current_note
from tokenkeys.router.service import RoutingConfig
from tokenkeys.router.workers.pool_setup import PoolSettings


@pytest.mark.parametrize("transport", ["zmq", "grpc"])
async def test_a_late_router_routes_a_cached_prefix_to_the_engine_holding_it(tmp_path, transport):
    configs = [engine_config(kv_events_buffer_steps=2) for _ in range(3)]
    settings = PoolSettings(cache=tmp_path / "cache")
    cluster = await start_cluster(3, settings=settings, transport=transport, configs=configs)
    late = None
    try:
        first = prompt_ids(cluster, "Conversation one. " + SYSTEM)
        decision, _ = await routed(cluster, first)
        home = decision.worker
        stack = cluster.stacks[cluster.number(home)]
        stored_at = stack.local().stream.next_seq - 1
        for n in range(3):  # the engines go on serving: the buffer forgets the first prompt
            for other in cluster.stacks:
                await other.generate(
                    token_ids={"ids": prompt_ids(cluster, f"Other traffic {n}. " * 12)},
                    stopping={"max_tokens": 1},
                )
        assert stack.local().stream.next_seq - 2 > stored_at  # not replayable any more

        config = RoutingConfig(
            workers=tuple(cluster.addresses),
            transport=transport,
            poll_interval=0.2,
            timeout=1.0,
            retry_delay=0.1,
            pools=PoolSettings(cache=tmp_path / "late"),
        )
        late = await RouterProcess(RouterProcessConfig(config, http_port=None)).start()
        service = late.service
        await wait_until(
            lambda: all(
                (ws := service.registry.workers.get(a)) is not None and ws.state == "ready"
                for a in cluster.addresses
            ),
            what="late router ready",
        )
        pool = service.router.pool(None)
        worker = pool.index_id(home)

        async def holds(ids: list[int]) -> bool:
            found = await service.index.lookup(await pool.block_keys(ids, None))
            return worker in found and found[worker].blocks == len(ids) // 16

        # Joining is asynchronous (the worker is ready before its snapshot is in): wait for it.
        await wait_until(lambda: holds(first), what="snapshot loaded")
        note = RouteNote()
        token = current_note.set(note)
        try:
            async for _ in service.engine().generate(first):
                pass
        finally:
            current_note.reset(token)
        (again,) = note.decisions
        assert (again.worker, again.reason) == (home, "prefix")
        assert again.matched_blocks == len(first) // 16
        # The late router then follows the streams: a new prompt's blocks arrive as events.
        second = prompt_ids(cluster, "Conversation two. " + SYSTEM)
        await stack.generate(token_ids={"ids": second}, stopping={"max_tokens": 1})
        # A ZMQ subscriber sees its first live batch only when one is published.
        await wait_until(lambda: holds(second), what="followed after the snapshot")
    finally:
        if late is not None:
            await late.stop()
        await cluster.close()
