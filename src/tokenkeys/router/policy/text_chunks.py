"""The ``text_chunks`` policy: what a router that does not tokenize can estimate.

This is the approximate prefix scorer of gateway-api-inference-extension
(``pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go``, read at ``00913f9``): the
prompt's bytes are cut into 64-byte chunks (the first chunk hash is the model name's), each
chunk hashed with xxh64 chained on the previous hash, at most 256 chunks; the router remembers,
per worker and LRU-bounded, the chunk hashes of the requests it *sent* there, and scores a
worker by its run of remembered chunks from the start. It never learns what a worker evicted,
lost in a restart, or cached from another router, which is what the precise policy fixes.
Written here from that description (own code); it exists for ``bench/bench_routing.py``.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence

import xxhash

from tokenkeys.router.index.model import PrefixMatch
from tokenkeys.router.policy.decision import RouteDecision, RouteRequest
from tokenkeys.router.policy.scorer import WorkerScore, score_workers
from tokenkeys.router.workers.pool import Pool

#: gateway-api-inference-extension defaults (``DefaultHashBlockSize``,
#: ``DefaultMaxPrefixBlocks``, ``DefaultLRUCapacityPerServer``).
CHUNK_BYTES = 64
MAX_CHUNKS = 256
CAPACITY_PER_WORKER = 31_250


def chunk_hashes(text: str, model: str, chunk_bytes: int = CHUNK_BYTES) -> list[int]:
    """The chained hashes of ``text``'s full chunks (the model name's hash is not included)."""
    data = text.encode("utf-8")[: chunk_bytes * MAX_CHUNKS]
    prev = xxhash.xxh64_intdigest(model.encode("utf-8"))
    out = []
    for start in range(0, len(data) - chunk_bytes + 1, chunk_bytes):
        chunk = data[start : start + chunk_bytes] + prev.to_bytes(8, "little")
        prev = xxhash.xxh64_intdigest(chunk)
        out.append(prev)
    return out


class TextChunkTable:
    """Per worker, the chunk hashes of the prompts routed there (LRU, ``capacity`` each)."""

    def __init__(self, capacity: int = CAPACITY_PER_WORKER) -> None:
        self.capacity = capacity
        self._seen: dict[str, OrderedDict[int, None]] = {}

    def record(self, worker: str, hashes: Sequence[int]) -> None:
        """Remember that the prompt with ``hashes`` was sent to ``worker``."""
        table = self._seen.setdefault(worker, OrderedDict())
        for h in hashes:
            table[h] = None
            table.move_to_end(h)
        while len(table) > self.capacity:
            table.popitem(last=False)

    def forget(self, worker: str) -> None:
        """Drop everything remembered about ``worker`` (it left the pool)."""
        self._seen.pop(worker, None)

    def lookup(self, hashes: Sequence[int], workers: Collection[str]) -> dict[str, PrefixMatch]:
        """Each worker's run of remembered chunks from the first, as the index answers."""
        out = {}
        for worker in workers:
            table = self._seen.get(worker)
            if not table:
                continue
            run = 0
            for h in hashes:
                if h not in table:
                    break
                run += 1
            if run:
                out[worker] = PrefixMatch(worker, ((run, ("gpu",)),))
        return out


def _rank_key(score: WorkerScore) -> tuple[float, float]:
    return round(score.score, 12), score.load


class TextChunksPolicy:
    """Scores a worker by the prompt's chunks this router sent there (:class:`TextChunkTable`)."""

    name = "text_chunks"

    def __init__(self, capacity: int = CAPACITY_PER_WORKER) -> None:
        self.table = TextChunkTable(capacity)
        self._turn: dict[str, itertools.count[int]] = {}

    async def choose(
        self, pool: Pool, request: RouteRequest, load: Mapping[str, float], *, record: bool
    ) -> RouteDecision:
        """The longest remembered run; ``record`` remembers the prompt at the chosen worker."""
        text = request.text
        if text is None:
            text = pool.preprocessor.detokenize([list(request.token_ids)], field_name="prompt")[0]
        hashes = chunk_hashes(text, pool.name)
        ids = {pool.index_id(a): a for a in load}
        found = self.table.lookup(hashes, ids)
        ranking = score_workers({ids[w]: m for w, m in found.items()}, len(hashes), load)
        # Candidates equal in score and load: always taking the lowest id would pile every new
        # prefix on one worker while loads read equal between polls. The tie goes to the
        # emptiest KV cache (to 1 %, as polled), then the remaining ties take turns.
        ties = [s for s in ranking if _rank_key(s) == _rank_key(ranking[0])]
        if len(ties) > 1:
            usage = {s.worker: round(pool.kv_usage(s.worker), 2) for s in ties}
            emptiest = min(usage.values())
            ties = [s for s in ties if usage[s.worker] == emptiest]
            turn = next(self._turn.setdefault(pool.name, itertools.count()))
            chosen = ties[turn % len(ties)]
            ranking = [chosen, *(s for s in ranking if s is not chosen)]
        best = ranking[0]
        if record:
            self.table.record(pool.index_id(best.worker), hashes)
        return RouteDecision.first_of(
            ranking,
            model=pool.name,
            policy=self.name,
            total_blocks=len(hashes),
            reason="text_prefix" if best.matched_blocks else "load",
        )

    def forget(self, pool: Pool, address: str) -> None:
        """Drop the chunks remembered of ``address``."""
        self.table.forget(pool.index_id(address))
