"""Routing policies on three workloads over 4 engines: cache hits, TTFT and balance.

Four ``tokenkeys serve`` processes (simulated engines, vLLM 0.31+ ``sha256_cbor`` keys, 16-token
blocks, a bounded KV cache, ZMQ KV events) and one in-process router (``RouterProcess``, in
memory) that forwards token ids over ``Inference.Generate``, as smg's rows run one ``smg``
instance; the 2-replica row puts two such routers behind a load balancer that picks one at
random per request. Workloads (:func:`workloads`):

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
against the load there, blocks beyond a worker's KV capacity and recent cache growth,
``router.policy.cost``), on one router and on two replicas; ``precise, Dynamo's load price``
(a block of load costs like a block of prefill, as in Dynamo's selector); ``precise, prefix
only`` (load, overflow and growth weights 0: the longest cached prefix wins, ties by
rendezvous hash, which is how the policy routed before the cost model); ``text_chunks``
(gateway-api-inference-extension's approximation, 64-byte text chunks matched against what the
router sent each engine, no events); ``round_robin`` (the reference, no cache knowledge).
Reported per workload
and policy: cache hit ratio (``cached_tokens / prompt_tokens`` as the engines reported in usage)
and its ratio to round robin's, the engines' simulated time to first token (``overhead +
uncached tokens x prefill cost``) p50 and p90, and the share of requests of the busiest engine
(1/4 is even).

When SGLang's router smg (``smg==1.13.0``) can be installed, its ``cache_aware`` and
``prefix_hash`` policies add rows: the same workloads and questions sent as chat messages
through one ``smg launch`` in front of the same kind of engines' HTTP frontends
(``routing_smg``), the hit ratio again from the engines' own usage. Index ingest rate and
score latency are in the ``bench_router_index`` section.

A last, small section routes over two real vLLM 0.32 servers behind sidecars
(``routing_vllm``): vLLM's own ``cached_tokens``, precise against round robin.

``--replicas N`` runs only the concurrent workload's one-router and sharing-replica rows, N
times, with what sharing adds to a decision (``_share_cost``; each row's decision time, p50,
against one router's in the same run), what replicas deciding at the same instant missed
of each other (``router.replicas.contention``) and where the cached tokens they lost against
one router went, turn by turn (``routing_attribution``); ``--seed S`` draws run ``i``'s
questions and load balancer picks from seed ``S + i`` (0: the full section's), ``--ports P``
puts the engines on fixed ports from ``P`` (the same rendezvous orders, so two codes compared
on one seed see the same first round); ``--no-reconcile`` runs the sharing rows without moving
later copies of split prompts (``router.replicas.reconcile``; each row says how many it moved,
how many it found past their first output and how long after sending),
``--replica-slack X`` with that slack (``CostWeights.replica_slack``); ``--processes``
runs each of those routers in a process of its own, as an operator does
(``routing_processes``). ``routing_round0`` models the first round of those rows alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
from redis_local import LocalRedis
from routing_attribution import attribution
from routing_processes import run_policy_processes
from routing_smg import POLICIES as SMG_POLICIES
from routing_smg import SmgRouter, chat, quiet, smg_executable, smg_router
from routing_vllm import vllm_section
from routing_workload import (
    ENGINES,
    HEADER,
    MAX_TOKENS,
    MODEL,
    ROOT,
    Engine,
    Workload,
    drive,
    finish,
    router_config,
    sharing_figures,
    start_engines,
    time_decisions,
    wait_quiet,
    workloads,
)
from timing import pct

from tokenkeys.router.assembly import RouterProcess, RouterProcessConfig
from tokenkeys.router.policy.cost import CostWeights, GrowthLedger
from tokenkeys.router.policy.placement import Placement
from tokenkeys.router.replicas.shared_load import RedisSharedLoad
from tokenkeys.router.replicas.sharing import LocalLoad
from tokenkeys.router.routed_engine import RouteNote, current_note
from tokenkeys.router.service import RoutingService
from tokenkeys.router.workers.load_view import Flight

PLOT = ROOT / "docs" / "routing.png"
#: (row name, --policy, cost weights of the precise policy, router replicas, --share-load).
#: One router sees every request it routes, as the one smg instance of the smg rows does.
POLICIES = (
    ("precise", "precise", CostWeights(), 1, False),
    ("precise, 2 replicas", "precise", CostWeights(), 2, True),
    ("precise, 4 replicas", "precise", CostWeights(), 4, True),
    ("precise, 2 replicas, unshared", "precise", CostWeights(), 2, False),
    ("precise, Dynamo's load price", "precise", CostWeights(load=1.0), 1, False),
    ("precise, prefix only", "precise", CostWeights(load=0.0, overflow=0.0, growth=0.0), 1, False),
    ("text_chunks", "text_chunks", CostWeights(), 1, False),
    ("round_robin", "round_robin", CostWeights(), 1, False),
)


async def _run_policy(
    policy: str,
    cost: CostWeights,
    w: Workload,
    cache: str,
    replicas: int,
    share_url: str | None = None,
) -> dict:
    """A tokenkeys policy: in-process routers (``replicas`` of them) forwarding token ids over
    gRPC; with ``share_url`` they share their requests in flight and growth through it."""
    engines = await start_engines(w)
    config = router_config(engines, policy, cost, cache, share_url)
    # Each replica follows every engine's events (an in-memory index each); what it sent, its
    # requests in flight and its cache-growth counts are its own unless shared.
    routers = [await RouterProcess(RouterProcessConfig(config)).start() for _ in range(replicas)]
    await _shared_ready([r.service for r in routers])
    services = [r.service for r in routers]
    decide: list[float] = []
    for service in services:
        time_decisions(service, decide)
    # The load balancer's picks, apart from the workload's draws.
    balancer = random.Random(11 + w.seed)
    try:
        pool = services[0].router.pool(None)
        replicas = [s.engine() for s in services]

        async def send(messages: list[dict]) -> tuple[int, int, str, str | None]:
            ids = pool.preprocessor.tokenize_chat({"messages": messages}).tokens.ids
            engine = balancer.choice(replicas)
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
            assert last is not None and last.usage is not None
            reply = pool.preprocessor.detokenize([out], skip_special_tokens=True)[0]
            usage = last.usage
            return usage.prompt_tokens, usage.cached_prompt_tokens, reply, note.served_by[0]

        async def restart() -> None:
            await asyncio.to_thread(engines[0].restart, w)
            for _ in range(200):
                await asyncio.sleep(0.05)
                if all(engines[0].address in s.router.pool(None).members for s in services):
                    break

        result = await drive(w, send, restart, settle=lambda: _settle(services))
        result["decide"] = decide
        result.update(sharing_figures([s.shared for s in services]))
        return finish(result, result["served"])
    finally:
        for router in routers:
            await router.stop()
        for engine in engines:
            engine.stop()


async def _shared_ready(services: list[RoutingService]) -> None:
    """Wait until every replica follows the shared channel and has appended to it (its first
    sign of life: the connection its batches use is open) when there is one."""
    for _ in range(200):
        if all(
            getattr(s.shared, "following", True) and getattr(s.shared, "batches", 1)
            for s in services
        ):
            return
        await asyncio.sleep(0.02)


async def _settle(services: list[RoutingService]) -> None:
    for service in services:
        await wait_quiet(service)


async def _run_smg(executable: Path, policy: str, w: Workload, grpc: bool) -> dict:
    """An smg policy: one ``smg launch`` over the engines' HTTP frontends, or (``grpc``) over
    their VllmEngine faces, its ``cache_aware`` then fed by their KV events (routing_smg)."""
    engines = await start_engines(w)
    before_restart: Counter[str] = Counter()
    workers = [f"grpc://{e.address}" if grpc else e.http for e in engines]
    try:
        async with (
            smg_router(executable, policy, workers) as router,
            httpx.AsyncClient(timeout=120) as client,
        ):

            async def send(messages: list[dict]) -> tuple[int, int, str, str | None]:
                prompt, cached, reply = await chat(client, router.base, MODEL, messages, MAX_TOKENS)
                return prompt, cached, reply, None

            async def restart() -> None:
                if not grpc:  # smg counts what it routes per worker; an engine counts its own
                    before_restart.update(await _chat_requests(client, engines[:1]))
                await asyncio.to_thread(engines[0].restart, w)

            async def settle() -> None:
                if grpc:
                    await quiet(router)

            result = await drive(w, send, restart, settle=settle)
            if grpc:
                served = await _routed(router, engines)
            else:
                served = await _chat_requests(client, engines)
                served.update(before_restart)
            return finish(result, served)
    finally:
        for engine in engines:
            engine.stop()


async def _routed(router: SmgRouter, engines: list[Engine]) -> Counter[str]:
    """Requests smg sent each gRPC worker (``smg_worker_requests_total``)."""
    served: Counter[str] = Counter()
    for engine in engines:
        worker = f"grpc://{engine.address}"
        served[engine.address] = int(
            await router.counter("smg_worker_requests_total", worker=worker)
        )
    return served


async def _chat_requests(client: httpx.AsyncClient, engines: list[Engine]) -> Counter[str]:
    """Chat completions each engine answered, from its own /metrics (smg does not say)."""
    served: Counter[str] = Counter()
    for engine in engines:
        text = (await client.get(f"{engine.http}/metrics")).text
        for line in text.splitlines():
            if line.startswith("tokenkeys_http_requests_total{") and "chat/completions" in line:
                served[engine.address] += int(float(line.rsplit(" ", 1)[1]))
    return served


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
    names = list(results[workloads[0]])
    palette = plt.get_cmap("tab20").colors  # 20 colours: one per row (12 rows today)
    colors = [palette[j % len(palette)] for j in range(len(names))]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
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
    fig.legend(*left.get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    PLOT.parent.mkdir(exist_ok=True)
    fig.savefig(PLOT, dpi=90)
    plt.close(fig)
    return f"![cache hit ratio and busiest engine by workload and routing policy]({PLOT.name})"


async def _run_async(quick: bool) -> str:
    results: dict[str, dict[str, dict]] = {}
    lines = ["## Routing policies (bench_routing)", ""]
    smg, smg_note = await asyncio.to_thread(smg_executable)
    shared = LocalRedis()  # what the sharing replicas share (REDIS_URL, or one started here)
    try:
        with tempfile.TemporaryDirectory() as cache:
            for w in workloads(quick):
                results[w.name] = {}
                for name, policy, cost, replicas, share in POLICIES:
                    if share and shared.url is None:
                        continue  # no Redis here: the shared rows are left out (noted below)
                    url = shared.url if share else None
                    row = await _run_policy(policy, cost, w, cache, replicas, url)
                    results[w.name][name] = row
                for policy in SMG_POLICIES if smg is not None else ():
                    results[w.name][f"smg {policy}"] = await _run_smg(smg, policy, w, grpc=False)
                    results[w.name][f"smg {policy}, gRPC"] = await _run_smg(
                        smg, policy, w, grpc=True
                    )
    finally:
        shared.close()
    for w in workloads(quick):
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
        smg_rows = {name: r for name, r in res.items() if name.startswith("smg ")}
        if smg_rows:
            best = max(smg_rows, key=lambda name: smg_rows[name]["hit"])
            one = res["precise"]["hit"] / smg_rows[best]["hit"]
            lines.append(
                f"Cache hit ratio of precise routing (default weights) against smg's best "
                f"policy here ({best}): **{one:.2f}x** with one router, as smg runs."
            )
            if "smg cache_aware, gRPC" in res:
                events = res["smg cache_aware, gRPC"]["hit"]
                lines.append(
                    "Against smg's cache_aware fed by the engines' KV events (gRPC): "
                    f"**{res['precise']['hit'] / events:.2f}x**."
                )
            lines.append("")
        rows = [n for n in ("precise, 2 replicas", "precise, 4 replicas") if n in res]
        if rows:
            lines += [_replica_note(res, rows, w.systems), ""]
    lines += [
        f"{ENGINES} simulated engines behind one router (in the replica rows, 2 or 4 routers "
        "behind a load balancer picking one at random per request). Simulated TTFT = 1 ms + "
        "0.2 ms per uncached prompt token, without queueing; "
        '"busiest engine" is the share of requests the most used engine served (25 % is even). '
        "Precise routing uses the default cost weights (`--prefix-weight 1 --load-weight 0.125 "
        "--overflow-weight 1 --growth-weight 0.25`, docs/router.md): a block of load (in use "
        "or queued to prefill) costs 1/8 of a block of prefill, a block beyond the engine's "
        "KV capacity a whole one. The caches are sized so that the working set of a workload "
        "fits in the four engines together but not in one: round robin makes every engine "
        "cache every prompt, and evicts. With prefix-only weights a common header decides "
        "where every new prompt goes (the shared-header rows: one engine serves all); the "
        "growth term spreads new prompts. In the concurrent workload a round's 32 turns are "
        "routed before the first is answered, in random order, so for a moment some engines "
        "have many more of the round in flight than others; at Dynamo's price (a block of load "
        "like a block of prefill) that passing imbalance moves conversations off the engine "
        "that holds them, and their prefixes are computed again. The simulated engines admit "
        "a request only when its KV blocks are free (it waits otherwise) but run any number "
        "of admitted requests at the same speed and prefill them in parallel: load below the "
        "capacity costs nothing here, as it costs little on a real engine with short replies "
        "(16 tokens here). Every replica follows every engine's KV events. In the replica rows "
        "the replicas share their requests in flight (blocks in use, queued prefill) and "
        "their cache growth through one Redis (`--share-load`, router.replicas.shared_load: each "
        "decision made on local memory at once and told afterwards on a Redis stream; among "
        "the workers at most one prompt's worth dearer than the cheapest, the one caching most "
        "of the prompt takes it, a prompt new everywhere going to the rendezvous worker of its "
        "first block, `--replica-slack 1`; docs/router.md); in the unshared row each "
        "counts only its own, so two new prefixes routed by different replicas can land on "
        "one engine.",
        "",
        _smg_note(smg_note, smg is not None),
        "",
        _plot(results),
    ]
    return "\n".join(lines)


def _smg_note(where: str, ran: bool) -> str:
    if not ran:
        return f"smg rows skipped: {where}."
    return (
        f"The smg rows ({where}) run one `smg launch --policy <policy>` with its defaults in "
        "front of the four engines' HTTP frontends (`--worker-urls http://127.0.0.1:<port>`, "
        "loopback only), the same questions sent as chat messages to its "
        "`/v1/chat/completions`; the hit ratio is the engines' own `cached_tokens / "
        "prompt_tokens` from usage, the TTFT the engines' formula over the same counts, the "
        "busiest share from the engines' own request counters. smg registers the engines as "
        "generic OpenAI-compatible workers (it probes `/version` and `/server_info`, gets 404, "
        "and goes on), so it sees no KV events: `cache_aware` routes by its own radix tree "
        "of the text it sent each engine (a restarted engine's lost cache stays in that tree "
        "until its TTL), `prefix_hash` by a consistent hash of the prompt's head with a load "
        "bound. One smg instance holds all routing state, as one tokenkeys router does. "
        "smg's `cache_aware` turns to the least loaded worker only when the busiest has 64 "
        "more requests in flight than the idlest and 1.5 times as many (its defaults), which "
        "32 concurrent requests never reach: here it routes by cache affinity alone, and "
        "nothing stops it from sending an engine more than its KV cache holds. "
        "The `, gRPC` rows run the same policy with `--worker-urls grpc://127.0.0.1:<port>` "
        "against the engines' VllmEngine face (`serve --vllm-engine-face`): smg registers them "
        "as vLLM workers, tokenizes itself with their tokenizer and sends token ids, and its "
        "`cache_aware` indexes the engines' KV events (`SubscribeKvEvents`; each round settles "
        "until smg's `smg_kv_event_batches_total` stops moving, as the tokenkeys routers "
        "settle on the same events); a restarted engine clears its entries there. The busiest "
        "share of these rows is from smg's `smg_worker_requests_total`. In the shared-header "
        "workload the `cache_aware, gRPC` row sends every request to one engine: its event index "
        "finds the common header's blocks cached there, the longest match wins, and its load "
        "balancing waits for the imbalance above, so it routes as precise with prefix-only "
        "weights does."
    )


def _replica_note(res: dict[str, dict], rows: list[str], systems: int) -> str:
    """The sharing replicas against one router: hit ratio, decision time, what they missed
    (and, when the rows carry their turns, where their lost hits went: routing_attribution)."""
    one = res["precise"]
    parts = []
    for n in rows:
        r = res[n]
        added = pct(r["decide"], 50) - pct(one["decide"], 50)
        figures = (
            f" (decision {_us(r['decide'], 50)} p50, {1e6 * added:+,.0f} µs against one "
            f"router's {_us(one['decide'], 50)}; {r['concurrent']} pairs decided at the same "
            f"instant, {r['split']} of them a prefix placed on two workers "
            f"({r['split_blocks']} blocks computed twice), {r['piled']} new prefixes piled on "
            f"one worker; a peer's entry applied {_ms(r['fold'], 50)} / {_ms(r['fold'], 99)} "
            "p50 / p99 after it was appended"
        )
        if "moved" in r:
            figures += f"; {_reconciled(r)}"
        if r.get("took"):  # routers in processes of their own (routing_processes)
            figures += f"; {_took(r)}"
        if "turns" in r and "turns" in one:
            figures += f"; {attribution(one, r, systems)}"
        figures += ")"
        parts.append(f"{n.split(', ')[1]} **{r['hit'] / one['hit']:.3f}x**{figures}")
    return "Replicas sharing their load, against one router: " + "; ".join(parts) + "."


async def _share_cost(url: str, decisions: int = 2000) -> str:
    """What sharing adds to one decision, alone: the shared load's bookkeeping on the decision
    path (``place`` around the decision, ``sent`` with the request) for an 8k-token prompt,
    against one router's (``LocalLoad``), CPU per decision, a peer following."""
    namespace = f"bench-share-{uuid.uuid4().hex[:8]}"
    a, b = RedisSharedLoad(url, namespace=namespace), RedisSharedLoad(url, namespace=namespace)
    keys = tuple(range(512))  # an 8k-token prompt's block keys
    placement = Placement("m", "w", keys, keys[256:], 256.0)
    for shared in (a, b):
        await shared.start({}, lambda model: GrowthLedger())
    try:
        while not (a.following and b.following):
            await asyncio.sleep(0.01)
        costs = {}
        for name, shared in (("one router", LocalLoad()), ("sharing", a)):
            cpu = []
            for i in range(decisions):
                flight = Flight(keys, keys[256:], 0.0)
                started = time.thread_time()
                await shared.place(lambda: (placement, None))
                shared.sent("m", "w", flight)
                shared.finished(flight)
                cpu.append(time.thread_time() - started)
                if i % 32 == 31:
                    await asyncio.sleep(0)  # the batches go out as in a router
            costs[name] = cpu
        added = pct(costs["sharing"], 50) - pct(costs["one router"], 50)
        return (
            f"What sharing adds to one decision, alone ({decisions} decisions of an 8k-token "
            f"prompt, `place` + `sent` + `finished`, one peer following, load average "
            f"{os.getloadavg()[0]:.1f}): {_us(costs['sharing'], 50)} / "
            f"{_us(costs['sharing'], 99)} CPU p50 / p99 against one router's "
            f"{_us(costs['one router'], 50)}: **{1e6 * added:+,.1f} µs p50**; {a.batches} "
            f"XADD batches carried {a.appended} changes."
        )
    finally:
        await a.close()
        await b.close()


def _reconciled(r: dict) -> str:
    """A sharing row's requests the stream's order sent elsewhere (``router.replicas.
    reconcile``: later copies of new prompts, and new prompts balanced): moved before their
    first output (sent to moved, p50 / max), found past it (first output to the entry, p50 /
    max), or unmovable."""
    lead, behind = r["lead"], r["behind"]
    moved = f"{r['moved']} moved ({r.get('balanced', 0)} new prompts balanced, the rest copies)"
    if lead:
        moved += f" ({_ms(lead, 50)} / {_ms(lead, 100)} after sent, p50 / max)"
    late = f"{r['late']} found past their first output"
    if behind:
        late += f" ({_ms(behind, 50)} / {_ms(behind, 100)} after it)"
    return f"{moved}, {late}, {r['unmovable']} unmovable"


def _took(r: dict) -> str:
    """A process-mode row's request time (sent to answered) and its routers' loop lag."""
    took, lag = r["took"], r["lag"]
    return f"request {_us(took, 50)} p50, loop lag {_us(lag, 50)} / {_us(lag, 99)} p50 / p99"


def _us(values: list[float], q: float) -> str:
    return f"{1e6 * pct(values, q):,.0f} µs" if values else "n/a"


def _ms(values: list[float], q: float) -> str:
    return f"{1e3 * pct(values, q):.1f} ms" if values else "n/a"


async def _replica_rows(repeat: int, processes: bool, seed: int = 0, ports: int = 0) -> str:
    """The concurrent workload's one-router and sharing-replica rows, ``repeat`` times each
    (``--replicas N``: whether the ratio holds, not one lucky run), run ``i`` with the draws of
    seed ``seed + i`` (``--seed``: the questions and the load balancer's picks; 0 is the full
    section's); with ``processes`` (``--processes``) every router runs in a process of its
    own (``routing_processes``)."""
    concurrent = next(w for w in workloads(False) if w.name == "concurrent")
    shared = LocalRedis()
    lines = []
    try:
        lines.append("- " + await _share_cost(shared.url))
        with tempfile.TemporaryDirectory() as cache:
            for i in range(repeat):
                w = dataclasses.replace(concurrent, seed=seed + i, ports=ports)
                res = {}
                for name, policy, cost, replicas, share in POLICIES[:3]:
                    url = shared.url if share else None
                    if processes:
                        res[name] = await run_policy_processes(cost, w, cache, replicas, url)
                    else:
                        res[name] = await _run_policy(policy, cost, w, cache, replicas, url)
                rows = ["precise, 2 replicas", "precise, 4 replicas"]
                load = os.getloadavg()[0]
                one = 100 * res["precise"]["hit"]
                if processes:
                    one_took = f" ({_took(res['precise'])})"
                else:
                    one_took = ""
                note = _replica_note(res, rows, w.systems).split(": ", 1)[1]
                lines.append(
                    f"- run {i + 1} (seed {w.seed}, load average {load:.1f}): one router "
                    f"{one:.1f} %{one_took}; {note}"
                )
    finally:
        shared.close()
    return "\n".join(lines)


def run(quick: bool) -> str:
    """The Markdown section (see the module doc)."""
    before = os.getloadavg()[0]
    simulated = asyncio.run(_run_async(quick))
    between = os.getloadavg()[0]
    real = vllm_section()
    load = (
        f"Load average (1 min) on the machine: {before:.1f} before the simulated rows, "
        f"{between:.1f} after them, {os.getloadavg()[0]:.1f} after the real-vLLM rows (2 cores "
        "shared with other work; the hit ratios are counts, the simulated TTFT a formula over "
        "them, so neither depends on it, but the concurrent workload's overlap does)."
    )
    return simulated + "\n\n" + load + "\n\n" + real


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    if "--replicas" in sys.argv:
        repeat = int(sys.argv[sys.argv.index("--replicas") + 1])
        seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0
        ports = int(sys.argv[sys.argv.index("--ports") + 1]) if "--ports" in sys.argv else 0
        if "--replica-slack" in sys.argv:  # the sharing rows' slack (CostWeights.replica_slack)
            slack = float(sys.argv[sys.argv.index("--replica-slack") + 1])
            POLICIES = tuple(
                (n, p, dataclasses.replace(c, replica_slack=slack), r, s)
                for n, p, c, r, s in POLICIES
            )
        print(asyncio.run(_replica_rows(repeat, "--processes" in sys.argv, seed, ports)))
    else:
        print(run("--quick" in sys.argv))
