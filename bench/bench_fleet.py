"""Fleet scale: many engines' KV events into 2-4 router replicas, in memory and on a Redis Cluster.

Engines are event generators, not servers: each emits ``BlockStored`` batches of
:data:`STEP_BLOCKS` random u64 block keys (a 512-token prefill step of 16-token blocks), as a
vLLM publishes them, decoded already (the ZMQ and msgpack costs are ``bench_events``'). Every
router replica follows every engine, as ``tokenkeys route`` does: each applies the whole
fleet's batches through ``EventIngestor`` into its index.

- Memory: each replica is a process of its own with its own ``MemoryPrefixIndex`` (capacity
  for the whole fleet); the replicas run at once and each reports its ingest rate, the RSS its
  index added per block, and score latencies. The sum of their rates is the fleet's ingest
  across replicas (the machine's cores bound it: on 2 cores 4 replicas share 2).
- Cluster: a 3-master Redis Cluster (each master with a replica) started here on loopback;
  one index shared by the replicas, each replica process writing its share of the engines
  (with a shared index one replica per engine is enough; all would write the same entries).
  Reported: the sum of their ingest rates, the masters' memory per block, score latencies.

Score: a prompt of 8k and of 128k tokens (512 and 8,192 blocks), held whole by one engine and
by halves and quarters by others, looked up against every engine of the fleet (the router
passes its ready workers as the filter) and scored (``score_workers``); p50 and p99 of
:data:`SCORES` calls per size. After each score call, untimed, one engine's event batch is
applied, as a router applies events between lookups; in memory that update first applies the
lookup's deferred LRU touch (``router/index/memory.py``), and its CPU time is reported apart.
The extrapolation to 100M blocks and 10,000 engines is on paper from these measured costs
(docs/operating.md); nothing here runs at that size.

Sizes. The default (what ``python3 bench/run.py`` runs) is the issue's full size: 1,000 engines
x 10,000 blocks (10M blocks) in every memory replica, and 1,000 engines x
:data:`CLUSTER_BLOCKS` on the cluster (``--cluster-blocks N`` to change it). The full 10M on the
cluster runs with ``--cluster-only --cluster-replicas 0 --cluster-blocks 10000`` (about 2.3 GiB
on the masters; with a replica per master twice that, see docs/benchmarks.md); the cluster's
ingest applies each round's batches concurrently, as a router's followers do. ``--quick`` is
the small smoke size: 200 x 1,000 in memory, 100 x 200 on the cluster. A memory row is skipped,
with a note, when the machine's available memory cannot hold its replicas' indexes; the cluster is
flushed after each row.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 16
STEP_BLOCKS = 32
SCORES = 200
#: Blocks per engine on the cluster at the default size (1,000 engines).
CLUSTER_BLOCKS = 1_000
#: Bytes per block a memory replica is assumed to need when checking the machine can hold it
#: (measured about 200; the rest is headroom for the ingest's transient objects).
BYTES_PER_BLOCK_NEEDED = 280
PROMPTS = {"8k": 8 * 1024 // BLOCK, "128k": 128 * 1024 // BLOCK}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _engines(n: int) -> list[str]:
    return [f"10.{i // 250}.{i % 250}.1:8000" for i in range(n)]


def _batches(engines: list[str], blocks: int, seed: int):
    """Each engine's batches, round robin over the engines (as a fleet's events interleave)."""
    from tokenkeys.events.model import BlockStored, EventBatch, SpecRef

    spec = SpecRef("bench/standin", "0" * 64)
    rng = random.Random(seed)
    for _ in range(blocks // STEP_BLOCKS):
        for engine in engines:
            hashes = tuple(rng.getrandbits(64) for _ in range(STEP_BLOCKS))
            yield engine, EventBatch(0.0, (BlockStored(hashes, None, (), BLOCK),), 0, spec)


async def _ingest(
    index, engines: list[str], blocks: int, seed: int, concurrent: bool = False
) -> tuple[float, float, int]:
    """Seconds spent applying (generation excluded), CPU seconds of it, and blocks applied.

    ``concurrent``: each round's batches (one per engine) are applied at once, as a router's
    followers (one task per engine) apply them; the Redis index then sends a turn's writes as
    one pipeline. Otherwise one after the other (the in-memory index: no I/O to overlap)."""
    from tokenkeys.events.model import SpecRef
    from tokenkeys.router.ingest.ingestor import EventIngestor

    ingestor = EventIngestor(index, SpecRef("bench/standin", "0" * 64))
    spent, cpu, count = 0.0, 0.0, 0
    chunk: list = []
    size = len(engines) if concurrent else 1000
    for item in _batches(engines, blocks, seed):
        chunk.append(item)
        if len(chunk) == size:
            wall, used = await _apply(ingestor, chunk, concurrent)
            spent, cpu, count = spent + wall, cpu + used, count + len(chunk) * STEP_BLOCKS
            chunk = []
    if chunk:
        wall, used = await _apply(ingestor, chunk, concurrent)
        spent, cpu, count = spent + wall, cpu + used, count + len(chunk) * STEP_BLOCKS
    return spent, cpu, count


async def _apply(ingestor, chunk: list, concurrent: bool) -> tuple[float, float]:
    start, started = time.perf_counter(), time.process_time()
    if concurrent:
        await asyncio.gather(*(ingestor.apply(engine, batch) for engine, batch in chunk))
    else:
        for engine, batch in chunk:
            await ingestor.apply(engine, batch)
    return time.perf_counter() - start, time.process_time() - started


async def _place_prompts(index, engines: list[str]) -> dict[str, list[int]]:
    """Each prompt held whole by engine 0, its first half by 1-3, its first quarter by 4-7."""
    rng = random.Random(99)
    prompts = {}
    for name, n in PROMPTS.items():
        keys = [rng.getrandbits(64) for _ in range(n)]
        await index.add(engines[0], keys)
        for i in range(1, 4):
            await index.add(engines[i], keys[: n // 2])
        for i in range(4, 8):
            await index.add(engines[i], keys[: n // 4])
        prompts[name] = keys
    return prompts


async def _scores(index, engines: list[str], prompts: dict[str, list[int]]) -> dict[str, list]:
    """Per prompt size: score wall and CPU seconds, and the CPU seconds of the event batch
    applied after each score (untimed in the score: a router applies events between lookups)."""
    from tokenkeys.router.policy.scorer import score_workers

    load = dict.fromkeys(engines, 0)
    rng = random.Random(7)
    out = {}
    for name, keys in prompts.items():
        times, cpu, between = [], [], []
        for i in range(SCORES + 5):
            start, started = time.perf_counter(), time.process_time()
            best = score_workers(await index.lookup(keys, engines), len(keys), load)[0]
            ended = time.process_time()
            if i >= 5:
                times.append(time.perf_counter() - start)
                cpu.append(ended - started)
            assert best.worker == engines[0] and best.matched_blocks == len(keys)
            batch = [rng.getrandbits(64) for _ in range(STEP_BLOCKS)]
            started = time.process_time()
            await index.add(engines[i % len(engines)], batch)
            if i >= 5:
                between.append(time.process_time() - started)
        out[name], out[f"{name} cpu"], out[f"{name} between"] = times, cpu, between
    return out


def _memory_replica(engines: int, blocks: int, seed: int, barrier, queue) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from tokenkeys.router.index.memory import MemoryPrefixIndex

    names = _engines(engines)
    # Room for the fleet, the prompts and the batches applied between scores: nothing evicted.
    index = MemoryPrefixIndex(capacity=engines * blocks + 100_000)
    before = _rss()
    spent, cpu, count = asyncio.run(_ingest(index, names, blocks, seed))
    per_block = (_rss() - before) / count
    barrier.wait()  # every replica has ingested: the scores do not compete with ingest
    scores = asyncio.run(_score_memory(index, names))
    queue.put(
        {"seconds": spent, "cpu": cpu, "blocks": count, "bytes_per_block": per_block,
         "scores": scores}
    )  # fmt: skip


async def _score_memory(index, names: list[str]) -> dict[str, list]:
    return await _scores(index, names, await _place_prompts(index, names))


def _cluster_replica(
    url: str, namespace: str, engines: list[str], blocks: int, seed: int, barrier, queue
) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from tokenkeys.router.index.redis import RedisPrefixIndex

    async def go() -> tuple[float, float, int]:
        index = RedisPrefixIndex.from_url(url, namespace=namespace, timeout=30)
        try:
            return await _ingest(index, engines, blocks, seed, concurrent=True)
        finally:
            await index.close()

    spent, cpu, count = asyncio.run(go())
    barrier.wait()
    queue.put({"seconds": spent, "cpu": cpu, "blocks": count})


def _run_replicas(target, args_of, n: int) -> list[dict]:
    ctx = mp.get_context("spawn")
    queue, barrier = ctx.Queue(), ctx.Barrier(n)
    procs = [ctx.Process(target=target, args=(*args_of(i), barrier, queue)) for i in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join(60)
    return results


def _ms(values: list[float], q: float) -> str:
    from timing import pct

    return f"{pct(values, q) * 1e3:.2f} ms"


def _score_cell(scores: dict[str, list[float]], k: str) -> str:
    """Wall p50 / p99, then the scoring process's own CPU time p50 / p99 (load-independent)."""
    wall, cpu = scores[k], scores[f"{k} cpu"]
    return f"{_ms(wall, 50)} / {_ms(wall, 99)} ({_ms(cpu, 50)} / {_ms(cpu, 99)})"


def _available_memory() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


def _flush(url: str) -> None:
    """Empty every master of the bench's own cluster (their replicas follow)."""
    import redis

    client = redis.RedisCluster.from_url(url, socket_timeout=300)
    try:
        for node in client.get_primaries():
            node.redis_connection.flushall(asynchronous=True)  # GBs at full size
    finally:
        client.close()


def _used_memory(url: str) -> int:
    import redis

    client = redis.RedisCluster.from_url(url, socket_timeout=60)
    try:
        return sum(
            int(n.redis_connection.info("memory")["used_memory"]) for n in client.get_primaries()
        )
    finally:
        client.close()


def run(
    quick: bool,
    cluster_blocks: int = CLUSTER_BLOCKS,
    *,
    memory: bool = True,
    cluster_replicas: int = 1,
    router_replicas: tuple[int, ...] = (2, 4),
) -> str:
    """The Markdown section (see the module doc); ``memory`` False runs the cluster rows
    alone, ``cluster_replicas`` Redis replicas per master, ``router_replicas`` the rows."""
    from redis_local import start_cluster
    from timing import load_note

    mem_engines, mem_blocks = (200, 1_000) if quick else (1_000, 10_000)
    cl_engines, cl_blocks = (100, 200) if quick else (1_000, cluster_blocks)
    lines = ["## Fleet scale (`bench_fleet`)", ""]
    rows, notes, between = [], [], []
    for replicas in router_replicas if memory else ():
        need = replicas * mem_engines * mem_blocks * BYTES_PER_BLOCK_NEEDED
        if need > _available_memory():
            notes.append(
                f"Memory row with {replicas} replicas skipped: they need about {need / 2**30:.1f} "
                f"GiB and the machine had {_available_memory() / 2**30:.1f} GiB available."
            )
            continue
        res = _run_replicas(
            _memory_replica, lambda i: (mem_engines, mem_blocks, 1000 + i), replicas
        )
        rate = sum(r["blocks"] / r["seconds"] for r in res)
        per_cpu = sum(r["blocks"] / r["cpu"] for r in res) / len(res)
        per = sum(r["bytes_per_block"] for r in res) / len(res)
        scores = {k: [t for r in res for t in r["scores"][k]] for k in res[0]["scores"]}
        rows.append(
            f"| memory | {replicas} | {mem_engines:,} x {mem_blocks:,} | {rate:,.0f} | "
            f"{rate / replicas:,.0f} | {per_cpu:,.0f} | {per:.0f} B | "
            + " | ".join(_score_cell(scores, k) for k in PROMPTS)
            + f" | {os.getloadavg()[0]:.1f} |"
        )
        between.append(
            f"{replicas} replicas: "
            + ", ".join(
                f"after {k} {_ms(scores[f'{k} between'], 50)} / {_ms(scores[f'{k} between'], 99)}"
                for k in PROMPTS
            )
        )
    cluster = start_cluster(cluster_replicas)
    if cluster is None:
        notes.append("Cluster rows skipped: no `redis-server`/`redis-cli` here.")
    else:
        try:
            for replicas in router_replicas:
                namespace = f"bench-fleet-{uuid.uuid4().hex[:6]}"
                names = _engines(cl_engines)
                before = _used_memory(cluster.url)
                share = len(names) // replicas
                res = _run_replicas(
                    _cluster_replica,
                    lambda i, ns=namespace, nm=names, share=share: (
                        cluster.url,
                        ns,
                        nm[i * share : (i + 1) * share],
                        cl_blocks,
                        2000 + i,
                    ),
                    replicas,
                )
                total = sum(r["blocks"] for r in res)
                per = (_used_memory(cluster.url) - before) / total
                rate = sum(r["blocks"] / r["seconds"] for r in res)
                per_cpu = sum(r["blocks"] / r["cpu"] for r in res) / len(res)
                scores = asyncio.run(_score_cluster(cluster.url, namespace, names))
                peak = _used_memory(cluster.url)
                rows.append(
                    f"| cluster (3 masters{_replicas_of(cluster_replicas)}) | {replicas} | "
                    f"{cl_engines:,} x {cl_blocks:,} | "
                    f"{rate:,.0f} | {rate / replicas:,.0f} | {per_cpu:,.0f} | {per:.0f} B | "
                    + " | ".join(_score_cell(scores, k) for k in PROMPTS)
                    + f" | {os.getloadavg()[0]:.1f} |"
                )
                notes.append(
                    f"Cluster row with {replicas} router replicas: the masters' `used_memory` "
                    f"{peak / 2**30:.2f} GiB at the end ({total:,} blocks written)."
                )
                print(
                    rows[-1], notes[-1], sep="\n", file=sys.stderr, flush=True
                )  # kept if later rows fail
                _flush(cluster.url)  # the next row starts from an empty cluster
        finally:
            cluster.remove()
    lines += [
        "| index | replicas | engines x blocks | ingest, all replicas (blocks/s) | per replica | "
        "per replica CPU second | memory per block | score 8k p50 / p99 (CPU p50 / p99) | "
        "score 128k p50 / p99 (CPU p50 / p99) | load average |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Engines are event generators ({STEP_BLOCKS}-block `BlockStored` batches of random "
        "u64 keys, decoded), not servers. Memory: every replica a process of its own applying "
        "the whole fleet's batches through `EventIngestor` into its own `MemoryPrefixIndex`; "
        "the ingest column sums the replicas' rates (each measured over its apply calls only, "
        "batch generation excluded; "
        "per CPU second: blocks per second of the replica's own CPU time, what one core "
        "would ingest with the machine to itself; for the cluster that is the client's "
        "CPU only, the servers' is apart); memory per block is the RSS the index added, divided by "
        "the blocks. Cluster: one index shared by the replicas on a 3-master Redis Cluster "
        "(a replica per master) on this machine, each replica process writing its share of the "
        "engines; memory per block is the masters' `used_memory` added, per block (replicas "
        "hold as much again). Score: `lookup` over the whole fleet as the filter + "
        f"`score_workers`, {SCORES} calls per prompt size, the prompt held whole by one "
        "engine, by halves and quarters by 7 others. All processes share this machine's "
        f"{os.cpu_count()} cores (and the Redis servers), so replicas beyond the cores add "
        f"no rate here. CPU time of the {STEP_BLOCKS}-block batch applied after each score in "
        "memory (which applies that lookup's deferred LRU touch first), p50 / p99: "
        + "; ".join(between)
        + ".",
        "",
        load_note(),
        *(["", *notes] if notes else []),
    ]
    return "\n".join(lines)


def _replicas_of(n: int) -> str:
    return ", no replicas" if n == 0 else f", {n} replica{'s' if n > 1 else ''} each"


async def _score_cluster(url: str, namespace: str, names: list[str]) -> dict[str, list]:
    from tokenkeys.router.index.redis import RedisPrefixIndex

    index = RedisPrefixIndex.from_url(url, namespace=namespace, timeout=30)
    try:
        return await _scores(index, names, await _place_prompts(index, names))
    finally:
        await index.close()


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "src")]
    blocks = CLUSTER_BLOCKS
    if "--cluster-blocks" in sys.argv:
        blocks = int(sys.argv[sys.argv.index("--cluster-blocks") + 1])
    replicas = 1
    if "--cluster-replicas" in sys.argv:
        replicas = int(sys.argv[sys.argv.index("--cluster-replicas") + 1])
    rows = (2, 4)
    if "--router-replicas" in sys.argv:
        rows = tuple(int(n) for n in sys.argv[sys.argv.index("--router-replicas") + 1].split(","))
    print(
        run(
            "--quick" in sys.argv,
            blocks,
            memory="--cluster-only" not in sys.argv,
            cluster_replicas=replicas,
            router_replicas=rows,
        )
    )
