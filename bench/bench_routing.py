"""Routing policies on three workloads over 4 engines: cache hits, TTFT and balance.

Four ``tokenkeys serve`` processes (simulated engines, vLLM 0.31+ ``sha256_cbor`` keys, 16-token
blocks, a bounded KV cache, ZMQ KV events) and two in-process router replicas (``RoutingService``,
in memory) that forward token ids over ``Inference.Generate``; a load balancer in front picks a
replica at random per request. Workloads (:data:`WORKLOADS`):

- ``conversations``: N conversations, each opened with one of a few long system prompts shared
  by several of them, then turns of a user question and the engine's reply, interleaved at
  random; the routers apply the engines' events of one round before the next (a user thinks for
  seconds; events take milliseconds). Halfway through one engine restarts (its cache is lost).
- ``shared header``: the same, one request at a time, but 16 system prompts that all open with
  one common header of a few blocks, and caches that hold a quarter of the working set each.
  A policy that follows the header puts every new prompt on one engine.
- ``concurrent``: 16 system prompts; each round all conversations send their next turn at once
  (the engines really wait their simulated prefill and decode times, so requests overlap and a
  burst is routed before any load poll or event shows it).

Policies, each on fresh engines: ``precise`` with the default cost weights (prefill blocks
against KV blocks in use and recent cache growth, ``router.policy.cost``); ``precise, prefix only``
(load and growth weights 0: the longest cached prefix wins, ties by rendezvous hash, which is
how the policy routed before the cost model); ``text_chunks`` (gateway-api-inference-
extension's approximation, 64-byte text chunks matched against what the replica sent each
engine, no events); ``round_robin`` (the reference, no cache knowledge). Reported per workload
and policy: cache hit ratio (``cached_tokens / prompt_tokens`` as the engines reported in usage)
and its ratio to round robin's, the engines' simulated time to first token (``overhead +
uncached tokens x prefill cost``) p50 and p90, and the share of requests of the busiest engine
(1/4 is even). Index ingest rate and score latency are in the ``bench_router_index`` section.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from timing import pct

from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.routed_engine import RouteNote, current_note
from tokenkeys.router.service import RouterConfig, RoutingService
from tokenkeys.router.workers.pool_setup import PoolSettings

ROOT = Path(__file__).resolve().parent.parent
PLOT = ROOT / "docs" / "routing.png"
ENGINES = 4
REPLICAS = 2
#: (row name, --policy, cost weights of the precise policy)
POLICIES = (
    ("precise", "precise", CostWeights()),
    ("precise, prefix only", "precise", CostWeights(load=0.0, growth=0.0)),
    ("text_chunks", "text_chunks", CostWeights()),
    ("round_robin", "round_robin", CostWeights()),
)
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


def _workloads(quick: bool) -> tuple[Workload, ...]:
    k = 2 if quick else 1
    return (
        Workload("conversations", 4, 14, 48 // k, 6 // k, 384, restart=True),
        Workload("shared header", 16, 5, 32 // k, 5 // k, 192, header=True),
        Workload("concurrent", 16, 5, 32 // k, 5 // k, 192, concurrent=True),
    )


def _system(i: int, w: Workload) -> str:
    topic = TOPICS[i % len(TOPICS)]
    rules = " ".join(
        f"Rule {r}: when the user asks about {topic}, answer in at most {r + 2} sentences, cite "
        f"the relevant section number, and never guess a figure you were not given."
        for r in range(w.rules)
    )
    head = f"{HEADER} " if w.header else ""
    return f"{head}You are the {topic} assistant #{i}. {rules}"


def _serve_args(w: Workload, port: str = "0") -> list[str]:
    args = [
        sys.executable, "-m", "tokenkeys.cli", "serve", "--grpc-port", port, "--http-port", "0",
        "--num-kv-blocks", str(w.num_blocks),
    ]  # fmt: skip
    return args + (["--simulate-latency"] if w.concurrent else [])


def _start_engine(w: Workload, port: str = "0") -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        _serve_args(w, port), env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("gRPC listening on "):
            return proc, "127.0.0.1:" + line.rsplit(":", 1)[1].strip()
    proc.kill()
    raise RuntimeError("tokenkeys serve did not start")


def _restart_engine(proc: subprocess.Popen, port: str, w: Workload) -> subprocess.Popen:
    """Stop an engine and start a new process on the same gRPC port (empty cache)."""
    proc.terminate()
    proc.wait(20)
    return _start_engine(w, port)[0]


async def _quiet(service: RoutingService, rounds: int = 5) -> None:
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


async def _run_policy(policy: str, cost: CostWeights, w: Workload, cache: str) -> dict:
    started = await asyncio.gather(*(asyncio.to_thread(_start_engine, w) for _ in range(ENGINES)))
    procs = [p for p, _ in started]
    addresses = [a for _, a in started]
    config = RouterConfig(
        workers=tuple(addresses),
        policy=policy,
        poll_interval=0.2,
        pools=PoolSettings(cache=cache),
        cost=cost,
    )
    # Each replica follows every engine's events (an in-memory index each); what it sent, its
    # requests in flight and its cache-growth counts are its own.
    services = [await RoutingService(config).start() for _ in range(REPLICAS)]
    rng = random.Random(7)
    try:
        pool = services[0].router.pool(None)
        engines = [s.engine() for s in services]
        history = {
            c: [{"role": "system", "content": _system(c % w.systems, w)}]
            for c in range(w.conversations)
        }
        usage: list = []
        served: Counter[str] = Counter()

        async def turn_of(c: int, turn: int) -> None:
            tag = uuid.UUID(int=rng.getrandbits(128)).hex[:8]
            question = f"Question {turn} of conversation {c} ({tag}): {rng.choice(TOPICS)}?"
            messages = history[c] + [{"role": "user", "content": question}]
            ids = pool.preprocessor.tokenize_chat({"messages": messages}).tokens.ids
            engine = rng.choice(engines)
            note = RouteNote()
            token = current_note.set(note)
            try:
                out: list[int] = []
                last = None
                async for o in engine.generate(ids):
                    out.extend(o.token_ids)
                    last = o
            finally:
                current_note.reset(token)
            assert last is not None and last.usage is not None and last.timing is not None
            usage.append((last.usage, last.timing))
            served[note.served_by[0]] += 1
            reply = pool.preprocessor.detokenize([out], skip_special_tokens=True)[0]
            history[c] = messages + [{"role": "assistant", "content": reply}]

        for turn in range(w.turns):
            if w.restart and turn == w.turns // 2:  # one engine restarts: its cache is gone
                procs[0] = await asyncio.to_thread(
                    _restart_engine, procs[0], addresses[0].rsplit(":", 1)[1], w
                )
                for _ in range(200):
                    await asyncio.sleep(0.05)
                    if all(addresses[0] in s.router.pool(None).members for s in services):
                        break
            order = list(range(w.conversations))
            rng.shuffle(order)
            if w.concurrent:
                await asyncio.gather(*(turn_of(c, turn) for c in order))
            else:
                for c in order:
                    await turn_of(c, turn)
            for service in services:
                await _quiet(service)
        prompt = sum(u.prompt_tokens for u, _ in usage)
        ttft = [t.ttft_s for _, t in usage]
        return {
            "hit": sum(u.cached_prompt_tokens for u, _ in usage) / prompt,
            "p50": pct(ttft, 50),
            "p90": pct(ttft, 90),
            "busiest": max(served.values()) / sum(served.values()),
            "requests": sum(served.values()),
        }
    finally:
        for service in services:
            await service.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _plot(results: dict[str, dict[str, dict]]) -> str:
    """Write docs/routing.png (hit ratio per workload and policy); returns a Markdown image
    line, or a note when matplotlib is missing (``pip install tokenkeys[bench]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "_(plot skipped: matplotlib is not installed; `pip install -e '.[bench]'`)_"
    workloads = list(results)
    names = [name for name, _, _ in POLICIES]
    colors = ["#2b6", "#8c8", "#fa3", "#999"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(workloads))]
        left.bar(xs, [100 * results[wl][name]["hit"] for wl in workloads], width, label=name,
                 color=colors[j])  # fmt: skip
        right.bar(xs, [100 * results[wl][name]["busiest"] for wl in workloads], width,
                  color=colors[j])  # fmt: skip
    for ax, title, label in (
        (left, "Cache hit ratio", "prompt tokens from cache (%)"),
        (right, "Busiest engine", "share of requests (%)"),
    ):
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_title(title)
        ax.set_ylabel(label)
    right.axhline(50, color="#c33", linewidth=1, linestyle="--")
    left.legend(fontsize=7)
    fig.tight_layout()
    PLOT.parent.mkdir(exist_ok=True)
    fig.savefig(PLOT, dpi=90)
    plt.close(fig)
    return f"![cache hit ratio and busiest engine by workload and routing policy]({PLOT.name})"


async def _run_async(quick: bool) -> str:
    results: dict[str, dict[str, dict]] = {}
    lines = ["## Routing policies (bench_routing)", ""]
    with tempfile.TemporaryDirectory() as cache:
        for w in _workloads(quick):
            results[w.name] = {}
            for name, policy, cost in POLICIES:
                results[w.name][name] = await _run_policy(policy, cost, w, cache)
    for w in _workloads(quick):
        res = results[w.name]
        reference = res["round_robin"]
        what = {
            "conversations": f"{w.systems} long system prompts, each shared by a quarter of the "
            "conversations; turns one at a time; one engine restarts (empty cache) halfway",
            "shared header": f"{w.systems} system prompts opening with one common "
            f"{len(HEADER)}-character header; turns one at a time",
            "concurrent": f"{w.systems} system prompts; each round's turns sent at once, the "
            "engines waiting their simulated prefill and decode times",
        }[w.name]
        lines += [
            f"### {w.name}",
            "",
            f"{w.conversations} conversations x {w.turns} turns ({reference['requests']} "
            f"requests per policy), {w.num_blocks} KV blocks per engine; {what}.",
            "",
            "| policy | cache hit ratio | vs round robin | TTFT p50 | TTFT p90 | busiest engine |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, r in res.items():
            lines.append(
                f"| {name} | {100 * r['hit']:.1f} % | {r['hit'] / reference['hit']:.2f}x | "
                f"{1000 * r['p50']:.1f} ms | {1000 * r['p90']:.1f} ms | "
                f"{100 * r['busiest']:.0f} % |"
            )
        lines.append("")
    lines += [
        f"{ENGINES} simulated engines behind {REPLICAS} router replicas picked at random per "
        "request. Simulated TTFT = 1 ms + 0.2 ms per uncached prompt token, without queueing; "
        '"busiest engine" is the share of requests the most used engine served (25 % is even). '
        "Precise routing uses the default cost weights (`--prefix-weight 1 --load-weight 1 "
        "--growth-weight 0.25`, docs/router.md). The caches are sized so that the working set "
        "of a workload fits in the four engines together but not in one: round robin makes "
        "every engine cache every prompt, and evicts. With prefix-only weights a common header "
        "decides where every new prompt goes (the shared-header rows: one engine serves all); "
        "the growth term spreads new prompts, and the load term moves a conversation off a "
        "busier engine, which costs hits here because the simulated engines run any number "
        "of requests at once without slowing down: balance buys nothing in this simulation "
        "that it buys on a real engine (queueing, preemption, decode speed).",
        "",
        _plot(results),
    ]
    return "\n".join(lines)


def run(quick: bool) -> str:
    """The Markdown section (see the module doc)."""
    return asyncio.run(_run_async(quick))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    print(run("--quick" in sys.argv))
