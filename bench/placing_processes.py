"""Placing bursts of decisions from router replicas that each run in a process of their own.

``bench_routing --replicas`` runs its replicas, their event followers and the clients in one
process and measures placing inside routing; here the protocol is measured alone. Each
replica is a process with its own event loop and its own ``RedisSharedLoad`` against one
redis-server, and nothing else runs in it: every ``period`` seconds (on a shared clock) each
replica is asked a burst of decisions at once, places them (``router.replicas.placement_groups``),
sends, answers and finishes their requests as a router does, and reports what placing cost.
It measures the protocol (round trips, refusals, groups) apart from the routing around it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
import uuid
from typing import Any

from timing import pct

from tokenkeys.router.policy.cost import GrowthLedger
from tokenkeys.router.policy.placement import Placement
from tokenkeys.router.replicas.shared_load import RedisSharedLoad
from tokenkeys.router.workers.load_view import Flight

WORKERS = ("w0", "w1", "w2", "w3")
#: Bursts per replica, decisions per burst, seconds between bursts.
BURSTS, BURST, PERIOD = 40, 8, 0.2


async def _replica(
    url: str,
    namespace: str,
    index: int,
    start: float,
    bursts: int,
    burst: int,
    period: float,
    blocks: int,
) -> dict[str, Any]:
    """One replica process: ``bursts`` bursts of ``burst`` decisions on the shared clock.

    Its pools are empty (no load view holds the placements: what is measured is the stream's
    protocol, not the policy); each decision's ``PLACE`` round trips are timed around the real
    ``append``, and its request is sent, answered and finished as a router tells them.
    """
    shared = RedisSharedLoad(url, namespace=namespace)
    rtt: list[float] = []
    append = shared.append

    async def timed(placements: list[tuple[int, Placement]], force: bool) -> bool:
        began = time.perf_counter()
        try:
            return await append(placements, force)
        finally:
            rtt.append(time.perf_counter() - began)

    shared.append = timed  # type: ignore[method-assign]
    await shared.start({}, lambda model: GrowthLedger())
    while not shared.following:
        await asyncio.sleep(0.01)
    counter = 0

    async def one(n: int) -> None:
        # Keys of their own per replica and decision (no two prompts alike).
        keys = tuple(range(1_000_000 * index + 1000 * n, 1_000_000 * index + 1000 * n + blocks))
        placement = Placement("m", WORKERS[n % len(WORKERS)], keys, keys[-4:], 4.0)
        await shared.place(lambda: (placement, None))
        flight = Flight(keys, keys[-4:], time.monotonic())
        shared.sent("m", placement.worker, flight)
        await asyncio.sleep(0.01)  # the prefill
        shared.answered(flight)
        await asyncio.sleep(0.02)  # the decode
        shared.finished(flight)

    cpu = time.process_time()
    for b in range(bursts):
        await asyncio.sleep(max(0.0, start + b * period - time.time()))
        jobs = []
        for _ in range(burst):
            counter += 1
            jobs.append(one(counter))
        await asyncio.gather(*jobs)
    cpu = time.process_time() - cpu
    await shared.close()
    return {
        "place": list(shared.place_seconds),
        "rtt": rtt,
        "redecided": shared.redecided,
        "forced": shared.forced,
        "cpu": cpu,
    }


def _run(args: tuple[Any, ...], out: Any) -> None:
    out.put(asyncio.run(_replica(*args)))


def placing_bursts(
    url: str,
    replicas: int,
    *,
    bursts: int = BURSTS,
    burst: int = BURST,
    period: float = PERIOD,
    blocks: int = 24,
) -> dict[str, Any]:
    """``replicas`` processes each placing ``bursts`` bursts of ``burst`` decisions at once."""
    namespace = f"bench-bursts-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 3.0  # the processes' imports and connections come first
    procs = [
        ctx.Process(
            target=_run, args=((url, namespace, i, start, bursts, burst, period, blocks), out)
        )
        for i in range(replicas)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(10)
    merged: dict[str, Any] = {"place": [], "rtt": [], "redecided": 0, "forced": 0, "cpu": 0.0}
    for r in results:
        for k in merged:
            merged[k] += r[k]
    merged["load"] = os.getloadavg()[0]
    return merged


def burst_note(url: str, counts: tuple[int, ...] = (1, 2, 4)) -> str:
    """The Markdown line of :func:`placing_bursts` for 1, 2 and 4 replica processes."""
    parts = []
    for n in counts:
        r = placing_bursts(url, n)
        place, trips = r["place"], r["rtt"]
        parts.append(
            f"{n} (load average {r['load']:.1f}): placing {_ms(place, 50)} / {_ms(place, 99)} "
            f"per decision p50 / p99, round trip {_ms(trips, 50)} / {_ms(trips, 99)}, "
            f"{len(trips)} round trips for {len(place)} decisions, {r['redecided']} decided "
            f"again, {r['forced']} placed as they stood"
        )
    return (
        "Placing bursts from replicas in processes of their own and nothing else in them "
        f"(`bench/placing_processes.py`: every {PERIOD * 1000:.0f} ms each replica is asked "
        f"{BURST} decisions at once, {BURSTS} bursts; one redis-server on loopback): "
        + "; ".join(parts)
        + "."
    )


def _ms(values: list[float], q: float) -> str:
    return f"{1e3 * pct(values, q):.1f} ms"


if __name__ == "__main__":
    import sys

    from redis_local import LocalRedis

    redis = LocalRedis()
    try:
        print(burst_note(redis.url, tuple(int(a) for a in sys.argv[1:]) or (1, 2, 4)))
    finally:
        redis.close()
