"""The "hashed text chunks" baseline: what a router that does not tokenize can estimate.

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

from collections import OrderedDict
from collections.abc import Collection, Sequence

import xxhash

from tokenkeys.router.index.model import PrefixMatch

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
