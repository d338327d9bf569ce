"""The routing bench's workloads and drivers, shared by its in-process routers (``bench_routing``)
and its routers in processes of their own (``routing_processes``).

A :class:`Workload` is conversations over a few system prompts, played by :func:`drive` through
any router (``send``), over :data:`ENGINES` ``tokenkeys serve`` processes with simulated
engines (:func:`start_engines`); :func:`finish` turns what was served into the busiest engine's
share. The workloads themselves are described in ``bench_routing``'s module doc.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from timing import pct

from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.replicas.shared_load import RedisSharedLoad
from tokenkeys.router.service import RoutingConfig, RoutingService
from tokenkeys.router.workers.pool_setup import PoolSettings

ROOT = Path(__file__).resolve().parent.parent
ENGINES = 4
MODEL = "smollm2-135m-instruct"  # the model tokenkeys serve embeds
MAX_TOKENS = 16  # the engine's default when a gRPC Generate sets none
LATENCY = LatencyModel()  # what tokenkeys serve --simulate-latency uses

TOPICS = ("rail timetables", "tax forms", "router firmware", "garden irrigation")
HEADER = (
    "You are an assistant of the Northwind municipal help desk. Be precise, be brief, and "
    "never invent a figure."
)


@dataclass(frozen=True)
class Workload:
    """Conversations over ``systems`` system prompts (conversation c uses system c % systems)."""

    name: str
    systems: int
    rules: int  # sentences of each system prompt (about 30 tokens each)
    conversations: int
    turns: int
    num_blocks: int  # KV blocks per engine
    header: bool = False  # every system prompt opens with HEADER
    concurrent: bool = False  # a round's turns are sent at once, engines really wait
    restart: bool = False  # one engine restarts halfway
    seed: int = 0  # offsets the questions' and the load balancer's draws (--seed)
    ports: int = 0  # engine i listens on ports + 2i (gRPC) and + 2i + 1 (HTTP); 0: any


def workloads(quick: bool) -> tuple[Workload, ...]:
    """The three workloads (``quick``: half the conversations and turns)."""
    k = 2 if quick else 1
    return (
        Workload("conversations", 4, 14, 48 // k, 6 // k, 384, restart=True),
        Workload("shared header", 16, 5, 32 // k, 5 // k, 192, header=True),
        Workload("concurrent", 16, 5, 32 // k, 5 // k, 192, concurrent=True),
    )


def system_prompt(i: int, w: Workload) -> str:
    """System prompt ``i`` of ``w``: its topic, ``w.rules`` rules, the header if ``w`` has one."""
    topic = TOPICS[i % len(TOPICS)]
    rules = " ".join(
        f"Rule {r}: when the user asks about {topic}, answer in at most {r + 2} sentences, cite "
        f"the relevant section number, and never guess a figure you were not given."
        for r in range(w.rules)
    )
    head = f"{HEADER} " if w.header else ""
    return f"{head}You are the {topic} assistant #{i}. {rules}"


def serve_args(w: Workload, port: str, http_port: str) -> list[str]:
    """The command line of one engine's ``tokenkeys serve`` for ``w``."""
    args = [
        sys.executable, "-m", "tokenkeys.cli", "serve", "--grpc-port", port,
        "--http-port", http_port, "--num-kv-blocks", str(w.num_blocks),
        "--vllm-engine-face",  # smg's gRPC rows route to it; the other rows never call it
    ]  # fmt: skip
    return args + (["--simulate-latency"] if w.concurrent else [])


@dataclass
class Engine:
    """One ``tokenkeys serve`` process: its gRPC address and HTTP base URL."""

    proc: subprocess.Popen
    address: str
    http: str

    def restart(self, w: Workload) -> None:
        """Stop the process and start a new one on the same ports (empty cache)."""
        self.proc.terminate()
        self.proc.wait(20)
        grpc_port, http_port = self.address.rsplit(":", 1)[1], self.http.rsplit(":", 1)[1]
        self.proc = start_engine(w, grpc_port, http_port).proc

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_engine(w: Workload, port: str = "0", http_port: str = "0") -> Engine:
    """One engine for ``w``, once it says where it listens (port 0: any free port)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        serve_args(w, port, http_port),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    address = None
    for line in proc.stdout:
        if "gRPC listening on " in line:
            address = "127.0.0.1:" + line.rsplit(":", 1)[1].strip()
        elif "HTTP listening on " in line and address is not None:
            return Engine(proc, address, "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip())
    proc.kill()
    raise RuntimeError("tokenkeys serve did not start")


def time_decisions(service: RoutingService, into: list[float]) -> None:
    """Record the wall time of each of ``service``'s routing decisions (the policy's
    ``choose``: keys, lookup, scoring, the cost model, and the sharing's bookkeeping) into
    ``into``."""
    policy = service.router.policy
    choose = policy.choose

    async def timed(*args: object, **kwargs: object) -> object:
        began = time.perf_counter()
        try:
            return await choose(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - began)

    policy.choose = timed  # type: ignore[method-assign]


def sharing_figures(shared: list[object]) -> dict:
    """What the sharing replicas of one row missed of each other and how late they heard it
    (``router.replicas.contention``, ``RedisSharedLoad.fold_lag``); zeros for one router."""
    loads = [s for s in shared if isinstance(s, RedisSharedLoad)]
    out = {"concurrent": 0, "split": 0, "split_blocks": 0, "piled": 0, "fold": [], "batches": 0}
    out.update({"moved": 0, "late": 0, "unmovable": 0, "balanced": 0, "lead": [], "behind": []})
    for s in loads:
        m = s.reconciler
        out["moved"] += m.moved
        out["late"] += m.late
        out["unmovable"] += m.unmovable
        out["balanced"] += m.balanced
        out["lead"] += list(m.lead)
        out["behind"] += list(m.behind)
        c = s.contention
        out["concurrent"] += c.concurrent
        out["split"] += c.split
        out["split_blocks"] += c.split_blocks
        out["piled"] += c.piled
        out["fold"] += list(s.fold_lag)
        out["batches"] += s.batches
    return out


async def wait_quiet(service: RoutingService, rounds: int = 5) -> None:
    """Wait until no follower applied a new batch for ``rounds`` checks 20 ms apart."""

    def positions() -> list[object]:
        return [
            f.last_seq for ws in service.registry.workers.values() for f in ws.followers.values()
        ]

    last, still = positions(), 0
    while still < rounds:
        await asyncio.sleep(0.02)
        now = positions()
        still = still + 1 if now == last else 0
        last = now


#: One request through a router: the conversation so far in; the engine's prompt and cached
#: token counts, the reply text, and the engine that served it when the router says.
Send = Callable[[list[dict]], Awaitable[tuple[int, int, str, str | None]]]


async def drive(
    w: Workload,
    send: Send,
    restart: Callable[[], Awaitable[None]],
    settle: Callable[[], Awaitable[None]],
) -> dict:
    """Play the workload's conversations through ``send``; the same questions for every router
    (``rng`` draws only them). ``restart`` runs halfway when the workload restarts an engine;
    ``settle`` after each round (the router applies the round's engine events: a user thinks
    for seconds, events take milliseconds)."""
    rng = random.Random(7 + w.seed)
    history = {
        c: [{"role": "system", "content": system_prompt(c % w.systems, w)}]
        for c in range(w.conversations)
    }
    counts: list[tuple[int, int]] = []
    served: Counter[str] = Counter()
    # (conversation, turn) -> (prompt tokens, cached tokens, the worker that served it):
    # what routing_attribution compares between a replica row and one router's.
    turns: dict[tuple[int, int], tuple[int, int, str | None]] = {}

    async def turn_of(c: int, turn: int) -> None:
        tag = uuid.UUID(int=rng.getrandbits(128)).hex[:8]
        question = f"Question {turn} of conversation {c} ({tag}): {rng.choice(TOPICS)}?"
        messages = history[c] + [{"role": "user", "content": question}]
        prompt, cached, reply, by = await send(messages)
        counts.append((prompt, cached))
        turns[(c, turn)] = (prompt, cached, by)
        if by is not None:
            served[by] += 1
        history[c] = messages + [{"role": "assistant", "content": reply}]

    for turn in range(w.turns):
        if w.restart and turn == w.turns // 2:  # one engine restarts: its cache is gone
            await restart()
        order = list(range(w.conversations))
        rng.shuffle(order)
        if w.concurrent:
            await asyncio.gather(*(turn_of(c, turn) for c in order))
        else:
            for c in order:
                await turn_of(c, turn)
        await settle()
    # The simulated engines' own formula (engine.latency), from the counts they reported.
    ttft = [LATENCY.time_to_first_token(p - k) for p, k in counts]
    return {
        "hit": sum(k for _, k in counts) / sum(p for p, _ in counts),
        "p50": pct(ttft, 50),
        "p90": pct(ttft, 90),
        "served": served,
        "requests": len(counts),
        "turns": turns,
    }


async def start_engines(w: Workload) -> list[Engine]:
    """:data:`ENGINES` engines for ``w``, started side by side (on ``w.ports`` when set: the
    same addresses, hence the same rendezvous orders, for two runs compared by seed)."""
    ports = [
        (str(w.ports + 2 * i), str(w.ports + 2 * i + 1)) if w.ports else ("0", "0")
        for i in range(ENGINES)
    ]
    starts = (asyncio.to_thread(start_engine, w, *p) for p in ports)
    started = await asyncio.gather(*starts, return_exceptions=True)
    failed = [e for e in started if isinstance(e, BaseException)]
    if failed:  # e.g. a fixed port taken: stop the engines that did start, then say why
        for engine in started:
            if isinstance(engine, Engine):
                engine.stop()
        raise failed[0]
    return [e for e in started if isinstance(e, Engine)]


def finish(result: dict, served: Counter[str]) -> dict:
    """``result`` with the busiest engine's share of the requests in place of ``served``."""
    result["busiest"] = max(served.values()) / sum(served.values())
    del result["served"]
    return result


#: Whether sharing replicas reconcile their later copies of a new prompt (``--no-reconcile``
#: turns it off, to compare the two on the same seeds).
RECONCILE = "--no-reconcile" not in sys.argv


def router_config(
    engines: list, policy: str, cost: CostWeights, cache: str, share_url: str | None
) -> RoutingConfig:
    """The routers' configuration over ``engines``; with ``share_url`` they share their load
    through it, in a namespace of their own (and reconcile, unless ``--no-reconcile``)."""
    return RoutingConfig(
        workers=tuple(e.address for e in engines),
        policy=policy,
        poll_interval=0.2,
        pools=PoolSettings(cache=cache),
        cost=cost,
        redis_url=share_url,
        redis_namespace=f"bench-{uuid.uuid4().hex[:8]}",
        share_load=share_url is not None,
        reconcile=RECONCILE,
    )
