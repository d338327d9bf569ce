"""The hashed-text-chunk baseline: chunking as gateway-api-inference-extension's prefix plugin."""

from __future__ import annotations

import xxhash
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys.router.policy.text_chunks import (
    CHUNK_BYTES,
    MAX_CHUNKS,
    TextChunkTable,
    chunk_hashes,
)


def test_chunks_are_chained_xxh64_seeded_by_the_model_name():
    text = "a" * 64 + "b" * 64 + "tail"
    seed = xxhash.xxh64_intdigest(b"m")
    first = xxhash.xxh64_intdigest(b"a" * 64 + seed.to_bytes(8, "little"))
    second = xxhash.xxh64_intdigest(b"b" * 64 + first.to_bytes(8, "little"))
    assert chunk_hashes(text, "m") == [first, second]  # the partial tail has no hash
    assert chunk_hashes(text, "other")[0] != first
    assert chunk_hashes("x" * (CHUNK_BYTES * (MAX_CHUNKS + 3)), "m")[MAX_CHUNKS - 1 :] != []
    assert len(chunk_hashes("x" * (CHUNK_BYTES * (MAX_CHUNKS + 3)), "m")) == MAX_CHUNKS


@given(st.text(max_size=600), st.text(max_size=300))
def test_chunk_hashes_are_prefix_stable(prefix, suffix):
    whole = chunk_hashes(prefix + suffix, "m")
    head = chunk_hashes(prefix, "m")
    assert whole[: len(head)] == head


def test_the_table_remembers_runs_per_worker_and_forgets_by_lru():
    table = TextChunkTable(capacity=3)
    table.record("w1", [1, 2, 3])
    table.record("w2", [1, 9])
    found = table.lookup([1, 2, 3, 4], ["w1", "w2", "w3"])
    assert {w: m.blocks for w, m in found.items()} == {"w1": 3, "w2": 1}
    table.record("w1", [7])  # capacity 3: chunk 1 (least recent) goes
    assert "w1" not in table.lookup([1, 2], ["w1"])
    table.forget("w2")
    assert table.lookup([1], ["w2"]) == {}
