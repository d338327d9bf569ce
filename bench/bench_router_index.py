"""Prefix index: ingest rate (blocks/s) and score latency of a 128k-token prompt over 16 workers.

In memory and on Redis (``REDIS_URL``, else a ``redis-server`` started here on a free loopback
port without persistence; the Redis rows are skipped when neither exists). Every figure has a
reference measured in the same run:

- ingest, memory: a plain dict-of-dicts insertion of the same keys (no LRU, no reverse map,
  no validation): the floor of Python per-key work;
- ingest, Redis: one pipelined ``HSET`` per key, no script and no reverse set: the floor of a
  Redis round trip per chunk;
- score, memory: a bare loop of dict lookups over the prompt's keys;
- score, Redis: llm-d's lookup shape (llm-d-router ``kvblock/redis.go``): one pipelined
  ``HKEYS`` per prompt key, contiguity computed in the client.

Keys are random u64 values: computing them is measured by ``bench_keys``.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable

import redis
from redis_local import LocalRedis
from timing import load_note, pct, sample

from tokenkeys.events.model import BlockStored, EventBatch, SpecRef
from tokenkeys.process.run import freeze_started
from tokenkeys.router.index import table as index_table
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.index.redis import RedisPrefixIndex
from tokenkeys.router.ingest.ingestor import EventIngestor
from tokenkeys.router.policy.scorer import score_workers

BLOCK = 16
# Keys of the index the compiled and pure-Python tables are compared at (full runs).
FLEET_KEYS = 10_000_000
PROMPT_TOKENS = 128 * 1024
PROMPT_BLOCKS = PROMPT_TOKENS // BLOCK  # 8,192
WORKERS = [f"10.0.0.{i}:8000" for i in range(16)]
STEP_BLOCKS = 32  # blocks per BlockStored: a 512-token chunked-prefill step
SPEC = SpecRef("bench/standin", "0" * 64)


def _batches(blocks_per_worker: int, rng: random.Random) -> list[tuple[str, EventBatch]]:
    """vLLM-like steps: each worker stores its prompts STEP_BLOCKS blocks at a time."""
    out = []
    for _ in range(blocks_per_worker // STEP_BLOCKS):
        for worker in WORKERS:
            hashes = tuple(rng.getrandbits(64) for _ in range(STEP_BLOCKS))
            stored = BlockStored(hashes, None, (), BLOCK, medium="GPU")
            out.append((worker, EventBatch(0.0, (stored,), 0, SPEC)))
    return out


def _timed(loop: asyncio.AbstractEventLoop, coro_fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    loop.run_until_complete(coro_fn())
    return time.perf_counter() - start


def _ingest(loop, index: PrefixIndex, batches) -> float:
    ingestor = EventIngestor(index, SPEC)

    async def go() -> None:
        for worker, batch in batches:
            await ingestor.apply(worker, batch)

    return _timed(loop, go)


def _memory_floor(batches) -> float:
    start = time.perf_counter()
    table: dict[int, dict[str, str]] = {}
    for worker, batch in batches:
        for event in batch.events:
            for h in event.block_hashes:
                table.setdefault(h, {})[worker] = "gpu"
    return time.perf_counter() - start


def _redis_floor(loop, url: str, batches) -> float:
    client = redis.asyncio.Redis.from_url(url)

    async def go() -> None:
        for worker, batch in batches:
            pipe = client.pipeline(transaction=False)
            for event in batch.events:
                for h in event.block_hashes:
                    pipe.hset(f"{{bench-floor}}:b:{h}", worker, "gpu")
            await pipe.execute()
        await client.aclose()

    return _timed(loop, go)


async def _fill_prompt(index: PrefixIndex, prompt: list[int]) -> None:
    """Worker i holds the first (i + 1) / 16 of the prompt: the walk thins out to the end."""
    for i, worker in enumerate(WORKERS):
        await index.add(worker, prompt[: PROMPT_BLOCKS * (i + 1) // len(WORKERS)])


def _score_fn(loop, index: PrefixIndex, prompt: list[int]) -> Callable[[], object]:
    load = dict.fromkeys(WORKERS, 0)

    async def go() -> None:
        best = score_workers(await index.lookup(prompt), len(prompt), load)[0]
        assert best.matched_blocks == PROMPT_BLOCKS

    return lambda: loop.run_until_complete(go())


def _memory_lookup_floor(index: MemoryPrefixIndex, prompt: list[int]) -> Callable[[], object]:
    entries = index._entries  # the floor reads the same table without building runs

    def go() -> None:
        get = entries.get
        for key in prompt:
            get(key)

    return go


def _redis_lookup_floor(loop, url: str, namespace: str, prompt: list[int]):
    client = redis.asyncio.Redis.from_url(url)

    async def go() -> None:
        pipe = client.pipeline(transaction=False)
        for key in prompt:
            pipe.hkeys(f"{{{namespace}}}:b:{key}")
        replies = await pipe.execute()
        active = {w.decode() for w in replies[0]}
        for fields in replies[1:]:
            active &= {w.decode() for w in fields}
            if not active:
                break

    return (lambda: loop.run_until_complete(go())), client


def _pause() -> float:
    """Seconds of one full collection (the median of three)."""
    gc.collect()
    return statistics.median(sample(gc.collect, 3, warmup=0))


def _collection_rows(loop, keys: int, workers: int, rng: random.Random) -> list[str]:
    """A full collection's pause beside an index of ``keys`` keys held by ``workers`` workers:
    as served (frozen at start), not frozen, and with the reference beside it."""
    index = MemoryPrefixIndex(capacity=keys)
    held: dict[str, list[int]] = {f"w{i}": [] for i in range(workers)}

    async def fill() -> None:
        for i in range(keys // STEP_BLOCKS):
            worker, step = f"w{i % workers}", [rng.getrandbits(64) for _ in range(STEP_BLOCKS)]
            held[worker] += step
            await index.add(worker, step)

    loop.run_until_complete(fill())
    alone = _pause()
    # The reverse map as the index kept it before: a set of keys per worker (tracked).
    sets = [set(k) for k in held.values()]
    with_sets = _pause()
    del sets
    freeze_started()
    try:
        frozen = _pause()
    finally:
        gc.unfreeze()
    return [
        f"| frozen at start (`tokenkeys route`) | {_ms(frozen)} | {_ms(with_sets)} | "
        f"{frozen / with_sets:.3f} |",
        f"| not frozen (the index in a process of your own) | {_ms(alone)} | {_ms(with_sets)} | "
        f"{alone / with_sets:.2f} |",
    ]


# The compiled key table against the pure-Python one (issue 37's aims): blocks of 32 tokens, a
# fleet of workers each storing 32-block steps, one 128k-token prompt scored among them.
FLEET_BLOCK = 32
FLEET_PROMPT = PROMPT_TOKENS // FLEET_BLOCK  # 4,096
FLEET_WORKERS = 1000


def _built(keys: list[int], core: bool) -> MemoryPrefixIndex:
    """An index on the compiled table (``core``) or the pure-Python one."""
    saved = index_table.CORE
    if not core:
        index_table.CORE = None
    try:
        return MemoryPrefixIndex(capacity=len(keys) + 2 * FLEET_PROMPT)
    finally:
        index_table.CORE = saved


def _fleet_ingest(loop, index: MemoryPrefixIndex, keys: list[int]) -> float:
    """CPU seconds of adding ``keys`` in 32-block steps, round robin over the fleet."""

    async def go() -> None:
        for at in range(0, len(keys), STEP_BLOCKS):
            await index.add(f"w{(at // STEP_BLOCKS) % FLEET_WORKERS}", keys[at : at + STEP_BLOCKS])

    start = time.process_time()
    loop.run_until_complete(go())
    return time.process_time() - start


def _fleet_scores(loop, index: MemoryPrefixIndex, prompt: list[int], n: int) -> list[float]:
    """CPU seconds of each of ``n`` lookups + scores of ``prompt`` (16 workers hold parts)."""
    loop.run_until_complete(_fill_prompt(index, prompt))
    load = dict.fromkeys(WORKERS, 0)  # the scorer's own cost per fleet worker is not the index's

    async def go() -> None:
        best = score_workers(await index.lookup(prompt), len(prompt), load)[0]
        assert best.matched_blocks == len(prompt)

    out = []
    freeze_started()  # as `tokenkeys route` serves: what was built is out of full collections
    try:
        for _ in range(n):
            start = time.process_time()
            loop.run_until_complete(go())
            out.append(time.process_time() - start)
    finally:
        gc.unfreeze()
    return out


def _bytes_per_key(loop, count: int, core: bool, rng: random.Random) -> float:
    """Bytes allocated per key (one holder each) by an index of ``count`` keys (tracemalloc:
    Python objects and the C table's slot array, both allocated through CPython)."""
    keys = [rng.getrandbits(64) for _ in range(count)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = _built(keys, core)
        _fleet_ingest(loop, index, keys)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del index
    return (after - before) / count


def _native_rows(loop, count: int, n_score: int, rng: random.Random) -> list[str]:
    """Rows of the compiled table against the pure-Python one at ``count`` keys."""
    keys = [rng.getrandbits(64) for _ in range(count)]
    prompt = [rng.getrandbits(64) for _ in range(FLEET_PROMPT)]
    rates, scores = [], []
    for core in (True, False):
        index = _built(keys, core)
        rates.append(count / _fleet_ingest(loop, index, keys))
        scores.append(_fleet_scores(loop, index, prompt, n_score))
        del index
        gc.collect()
    sizes = [_bytes_per_key(loop, min(count, 1_000_000), core, rng) for core in (True, False)]
    c50, p50 = (pct(s, 50) for s in scores)
    c99, p99 = (pct(s, 99) for s in scores)
    return [
        f"| ingest, blocks per CPU-second | {rates[0]:,.0f} | {rates[1]:,.0f} | "
        f"{rates[0] / rates[1]:.2f}x | >= 3,000,000 |",
        f"| lookup + score, CPU p50 | {_ms(c50)} | {_ms(p50)} | {p50 / c50:.2f}x faster | |",
        f"| lookup + score, CPU p99 | {_ms(c99)} | {_ms(p99)} | {p99 / c99:.2f}x faster | < 1 ms |",
        f"| bytes per block entry | {sizes[0]:,.0f} | {sizes[1]:,.0f} | "
        f"{sizes[0] / sizes[1]:.2f}x | <= 100 |",
    ]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def run(quick: bool) -> str:
    """Markdown section: ingest blocks/s and score latency, memory and Redis, with references."""
    rng = random.Random(7)
    blocks_per_worker = 1024 if quick else 4096
    batches = _batches(blocks_per_worker, rng)
    total = sum(len(b.events[0].block_hashes) for _, b in batches)
    prompt = [rng.getrandbits(64) for _ in range(PROMPT_BLOCKS)]
    n_score = 10 if quick else 40
    gc_keys, gc_workers = (200_000 if quick else 2_000_000), 200
    fleet_keys = 200_000 if quick else FLEET_KEYS
    loop = asyncio.new_event_loop()
    ingest_rows, score_rows, notes = [], [], []
    server = LocalRedis()
    try:
        memory = MemoryPrefixIndex(capacity=4 * total)
        t = _ingest(loop, memory, batches)
        floor = _memory_floor(batches)
        ingest_rows.append(
            f"| memory | {total / t:,.0f} | {total / floor:,.0f} (dict insert) | {floor / t:.2f} |"
        )
        memory = MemoryPrefixIndex(capacity=4 * PROMPT_BLOCKS)
        loop.run_until_complete(_fill_prompt(memory, prompt))
        got = sample(_score_fn(loop, memory, prompt), n_score, warmup=3)
        ref = sample(_memory_lookup_floor(memory, prompt), n_score, warmup=3)
        score_rows.append(
            f"| memory | {_ms(pct(got, 50))} | {_ms(pct(got, 90))} | "
            f"{_ms(pct(ref, 50))} (dict gets) | {pct(got, 50) / pct(ref, 50):.1f}x |"
        )
        gc_rows = _collection_rows(loop, gc_keys, gc_workers, rng)
        native_rows = _native_rows(loop, fleet_keys, n_score * 5, rng)
        if server.url is None:
            notes.append("Redis rows skipped: no `REDIS_URL` and no `redis-server` binary.")
        else:
            index = RedisPrefixIndex.from_url(server.url, namespace="bench-ingest", timeout=30)
            t = _ingest(loop, index, batches)
            floor = _redis_floor(loop, server.url, batches)
            ingest_rows.append(
                f"| Redis | {total / t:,.0f} | {total / floor:,.0f} (pipelined HSET) | "
                f"{floor / t:.2f} |"
            )
            loop.run_until_complete(index.close())
            server.flush()
            index = RedisPrefixIndex.from_url(server.url, namespace="bench-score", timeout=30)
            loop.run_until_complete(_fill_prompt(index, prompt))
            got = sample(_score_fn(loop, index, prompt), n_score, warmup=2)
            floor_fn, client = _redis_lookup_floor(loop, server.url, "bench-score", prompt)
            ref = sample(floor_fn, n_score, warmup=2)
            loop.run_until_complete(client.aclose())
            loop.run_until_complete(index.close())
            score_rows.append(
                f"| Redis | {_ms(pct(got, 50))} | {_ms(pct(got, 90))} | "
                f"{_ms(pct(ref, 50))} (llm-d: pipelined HKEYS) | "
                f"{pct(got, 50) / pct(ref, 50):.2f}x |"
            )
            server.flush()
    finally:
        server.close()
        loop.close()
    return "\n".join(
        [
            "## Prefix index (`bench_router_index`)",
            "",
            f"Ingest: {len(WORKERS)} workers, {blocks_per_worker:,} blocks each "
            f"({total:,} blocks) in decoded `BlockStored` batches of {STEP_BLOCKS} blocks (a "
            "512-token prefill step), applied through `EventIngestor` (spec check, u64 keys, "
            "index update, metrics; Redis: one atomic Lua call per batch).",
            "",
            "| backend | blocks/s | reference blocks/s | rate / reference |",
            "|---|---:|---:|---:|",
            *ingest_rows,
            "",
            f"Score: one {PROMPT_TOKENS:,}-token prompt ({PROMPT_BLOCKS:,} blocks of {BLOCK}) "
            f"over {len(WORKERS)} workers, worker *i* holding the first (i+1)/16 of it; "
            "`lookup` + `score_workers`, "
            f"{n_score} calls. Redis answers in one script call that stops when no worker "
            "continues.",
            "",
            "| backend | p50 | p90 | reference p50 | p50 / reference |",
            "|---|---:|---:|---:|---:|",
            *score_rows,
            "",
            "The memory score is the prompt's keys checked once (type and range), one table get "
            "per key, a scan for where the set of holders changes (keys share one immutable "
            "holder set, so this compares identities in C), per-worker work only at those "
            "changes, and one LRU touch per matched key. Before the shared holder sets, each "
            "worker's run was walked key by key in Python (5.1 ms here, 4 ms of it that walk). "
            "Computing the prompt's keys is not in these figures (`bench_keys`: "
            "`vllm/xxhash_cbor` 128k tokens in about 5 ms).",
            "",
            f"Full collection: the pause of one `gc.collect()` (median of 3) in a process "
            f"holding a memory index of {gc_keys:,} keys over {gc_workers} workers; reference: "
            "the same process with a set of keys per worker beside it, the reverse map the "
            "index kept before (CPython tracks every set, and a full pass walks each entry; the "
            "per-worker key logs are `array('Q')`, never tracked). The compiled key table is "
            "never "
            "tracked; the pure-Python one is, and the serving commands freeze what they built "
            "at start (`gc.freeze`), that table with it, however far it grows.",
            "",
            "| index | pause | reference pause | pause / reference |",
            "|---|---:|---:|---:|",
            *gc_rows,
            "",
            f"Compiled key table against the pure-Python one (issue 37): the in-memory index "
            f"on `tokenkeys.router.index._table` ({index_table.describe()}) and on "
            f"`PyKeyTable` in the same run, each filled with {fleet_keys:,} random keys in "
            f"{STEP_BLOCKS}-block steps over {FLEET_WORKERS:,} workers (CPU time of `add`, "
            f"validation included), then one {PROMPT_TOKENS:,}-token prompt ({FLEET_PROMPT:,} "
            f"blocks of {FLEET_BLOCK}) held by 16 of them as above, `lookup` + "
            f"`score_workers` {n_score * 5} times (CPU time of each, the process frozen as "
            "served; each lookup's LRU touch is paid within it; loads given for the 16 "
            "holders). Bytes per block entry: what tracemalloc counts allocated by an index of "
            f"{min(fleet_keys, 1_000_000):,} keys, one holder each (the table's slot array, "
            "grown to the index's capacity once it holds an eighth of it, and the per-worker key "
            "logs). The last column is issue 37's aim.",
            "",
            "| figure | C table | pure Python | C against Python | aim |",
            "|---|---:|---:|---:|---:|",
            *native_rows,
            "",
            load_note(),
            *(["", *notes] if notes else []),
        ]
    )
