"""The concurrent workload's routers as an operator runs them: each in a process of its own.

``bench_routing`` runs its routers in the bench's own process and event loop, beside the
clients, so a burst's decisions there are made back to back in one turn of the loop. Here
every router (the one router of the reference row, or each of 2-4 sharing replicas) is a
process of its own (``RouterProcess`` with its HTTP frontend, as ``tokenkeys route`` runs),
the bench process only plays the conversations over HTTP (``/v1/chat/completions``: the
router tokenizes, as it does for a client) to a replica picked at random per request, as a
load balancer does. The served worker comes from the router's ``x-tokenkeys-worker`` header,
the counts from the engines' usage; each replica reports its decision times and sharing
figures over a pipe when the run ends, with its event loop's lag (how late a 5 ms sleep
wakes: how long a ready callback, such as a peer's entry, waits behind the loop's other
work). The bench also times each request from sent to answered.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from collections import Counter
from typing import Any

import httpx
from routing_workload import (
    MAX_TOKENS,
    MODEL,
    Workload,
    drive,
    finish,
    router_config,
    sharing_figures,
    start_engines,
    time_decisions,
    wait_quiet,
)

from tokenkeys.router.assembly import RouterProcess, RouterProcessConfig
from tokenkeys.router.headers import HEADER_WORKER
from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.service import RoutingConfig

#: Seconds between the loop-lag probe's wake-ups.
_TICK = 0.005


async def _lag(lags: list[float]) -> None:
    """Record how late each ``_TICK`` sleep wakes (the loop busy with other work)."""
    while True:
        began = time.perf_counter()
        await asyncio.sleep(_TICK)
        lags.append(time.perf_counter() - began - _TICK)


async def _serve(config: RoutingConfig, conn: Any) -> None:
    """One router process: start, say its port, then answer the bench's commands."""
    server = await RouterProcess(RouterProcessConfig(config, http_port=0)).start()
    service = server.service
    decide: list[float] = []
    time_decisions(service, decide)
    lags: list[float] = []
    probe = asyncio.create_task(_lag(lags))
    try:
        for _ in range(200):  # a sharing replica follows the stream before it is used
            if getattr(service.shared, "following", True):
                break
            await asyncio.sleep(0.02)
        conn.send(server.http_port)
        loop = asyncio.get_running_loop()
        while True:
            command = await loop.run_in_executor(None, conn.recv)
            if command == "begin":  # the workload starts: lag from here on
                lags.clear()
                decide.clear()
            elif command == "settle":  # the round's engine events applied here
                await wait_quiet(service)
                conn.send("settled")
            elif command == "stats":
                stats = sharing_figures([service.shared])
                conn.send({**stats, "decide": decide[:], "lag": lags[:]})
            else:
                break
    finally:
        probe.cancel()
        await server.stop()


def _router_process(config: RoutingConfig, conn: Any) -> None:
    asyncio.run(_serve(config, conn))


async def run_policy_processes(
    cost: CostWeights, w: Workload, cache: str, replicas: int, share_url: str | None
) -> dict:
    """The precise policy with ``replicas`` routers, each in its own process; with
    ``share_url`` they share their load through it."""
    engines = await start_engines(w)
    config = router_config(engines, "precise", cost, cache, share_url)
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    try:
        for _ in range(replicas):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_router_process, args=(config, there), daemon=True)
            proc.start()
            pipes.append(here)
            procs.append(proc)
        ports = [await asyncio.to_thread(p.recv) for p in pipes]
        for pipe in pipes:
            pipe.send("begin")
        took: list[float] = []
        # The load balancer's picks, as in bench_routing's rows.
        balancer = random.Random(11 + w.seed)
        timeout = httpx.Timeout(60.0)
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:

            async def send(messages: list[dict]) -> tuple[int, int, str, str | None]:
                port = balancer.choice(ports)
                body = {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS}
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                began = time.perf_counter()
                response = await client.post(url, json=body)
                took.append(time.perf_counter() - began)
                response.raise_for_status()
                answer = response.json()
                usage = answer["usage"]
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                reply = answer["choices"][0]["message"]["content"]
                return usage["prompt_tokens"], cached, reply, response.headers[HEADER_WORKER]

            async def settle() -> None:
                for pipe in pipes:
                    pipe.send("settle")
                for pipe in pipes:
                    await asyncio.to_thread(pipe.recv)

            async def restart() -> None:
                raise NotImplementedError("the process mode runs the concurrent workload")

            result = await drive(w, send, restart, settle)
        result.update(sharing_figures([]), decide=[], lag=[], took=took)
        for pipe in pipes:
            pipe.send("stats")
            stats = await asyncio.to_thread(pipe.recv)
            for name, value in stats.items():
                result[name] += value
        return finish(result, Counter(result["served"]))
    finally:
        for pipe in pipes:
            try:
                pipe.send("stop")
            except OSError:
                pass
        for proc in procs:
            await asyncio.to_thread(proc.join, 20)
            if proc.is_alive():
                proc.kill()
        for engine in engines:
            engine.stop()
