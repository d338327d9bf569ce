"""Routing that balances, over four simulated engines and a real router (gRPC, ZMQ events).

New prefixes spread by load: requests arriving together are counted in flight where they went
before the next is routed, so a burst spreads before any load poll shows it. A worker holding
only a short common header does not attract every new prompt. No timings are asserted: a burst
is routed within one turn of the event loop (routing a prompt never waits on I/O with the
in-memory index and local keys), and sequential requests wait for the events to be applied.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from routing_support import collect, index_run, start_cluster, wait_until

from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.routed_engine import RouteNote, current_note

# Every decision here through the compiled ranking and through the Python path (conftest).
pytestmark = pytest.mark.usefixtures("rank_core")

HEADER = "Northwind municipal help desk. Be precise and brief; never invent a figure."


def body(i: int) -> str:
    topics = ("rail timetables", "tax forms", "router firmware", "garden irrigation")
    return " ".join(
        f"Desk {i} rule {r}: about {topics[(i + r) % 4]}, answer in at most {r + 2} sentences "
        "and cite the section number."
        for r in range(6)
    )


async def served_by(cluster, ids: list[int]) -> str:  # noqa: ANN001
    """Run one prompt through the router; the address that served it."""
    note = RouteNote()
    token = current_note.set(note)
    try:
        await collect(cluster.engine(), ids)
    finally:
        current_note.reset(token)
    return note.served_by[0]


def chat_ids(cluster, system: str, question: str) -> list[int]:  # noqa: ANN001
    pool = next(iter(cluster.registry.pools.values()))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return pool.preprocessor.tokenize_chat({"messages": messages}).tokens.ids


async def test_a_burst_of_new_prompts_spreads_before_any_load_poll(settings):
    # The burst is routed within one turn of the event loop: no load poll, refresh or event
    # can arrive in between, so what spreads it is what the router knows it has in flight.
    cluster = await start_cluster(4, settings=settings)
    try:
        prompts = [chat_ids(cluster, body(i), "Where do I start?") for i in range(8)]
        served = await asyncio.gather(*(served_by(cluster, ids) for ids in prompts))
        assert Counter(served) == Counter(dict.fromkeys(cluster.addresses, 2))
        await cluster.settle()
        # A second burst: two questions on each of four new system prompts. The second of a
        # pair follows the first, whose blocks are in flight there (no event has arrived),
        # and the four pairs go to four workers.
        pairs = [
            chat_ids(cluster, body(10 + i), question)
            for i in range(4)
            for question in ("First question?", "Second question, a little longer?")
        ]
        served = await asyncio.gather(*(served_by(cluster, ids) for ids in pairs))
        assert [served[2 * i] for i in range(4)] == [served[2 * i + 1] for i in range(4)]
        assert len(set(served)) == 4
        # Nothing left in flight once the requests finished, nor queued to prefill (each
        # request's first output ended its prefill); the capacity came with the load polls.
        pool = next(iter(cluster.registry.pools.values()))
        views = [m.view for m in pool.members.values()]
        assert all(not v.inflight and not v.inflight_keys for v in views)
        assert all(not v.prefilling_keys for v in views)
        capacities = {c.engine.num_kv_blocks for c in cluster.configs}
        await wait_until(lambda: {v.capacity for v in views} == capacities, what="capacities")
    finally:
        await cluster.close()


@pytest.mark.parametrize(
    ("weights", "most"),
    [
        (CostWeights(), 3),  # 12 prompts over 4 workers: no worker more than 3
        (CostWeights(load=0.0, growth=0.0), 12),  # the header alone decides: all on one
    ],
    ids=["default", "prefix_only"],
)
async def test_a_short_common_header_does_not_attract_every_new_prompt(settings, weights, most):
    cluster = await start_cluster(4, settings=settings)
    cluster.router.policy.cost = weights
    try:
        served = Counter()
        for i in range(12):
            ids = chat_ids(cluster, f"{HEADER} {body(i)}", "Where do I start?")
            served[await served_by(cluster, ids)] += 1
            await cluster.settle()  # every engine's events applied: the header is indexed
        assert max(served.values()) == most, served
        if most < 12:
            # And each prompt's follow-up still goes where its system prompt is cached.
            for i in range(4):
                first = chat_ids(cluster, f"{HEADER} {body(i)}", "Where do I start?")
                again = chat_ids(cluster, f"{HEADER} {body(i)}", "And after that, where?")
                runs = {a: await index_run(cluster, first, a) for a in cluster.addresses}
                holder = max(runs, key=runs.__getitem__)
                assert runs[holder] > 0
                assert await served_by(cluster, again) == holder
                await cluster.settle()
    finally:
        await cluster.close()
