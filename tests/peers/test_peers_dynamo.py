"""``dynamo/xxh3@1.6`` against Dynamo's released code: ``ai-dynamo-runtime`` 1.6.1.

What the release exposes to Python is ``dynamo._core.compute_block_hash_for_seq``: the local
block hashes the kv-router computes from a request (``tokens_hash``), with LoRA name, cache
namespace and per-block multimodal objects. tokenkeys' keys are Dynamo's sequence hashes, whose
first element is the first local hash; so for random requests:

* every block alone (no parent) must key to Dynamo's local hash of that block, which checks the
  seed (adapter, namespace), the u32-LE token bytes and the sorted u64 multimodal hashes;
* the whole prompt must key to the chain of Dynamo's local hashes under the sequence-hash step
  ``XXH3-64(u64-LE(previous) || u64-LE(local), seed 1337)``. That step
  (``compute_next_sequence_hash``, ``lib/tokens/src/lib.rs``) is not reachable from the wheel's
  Python API, so it is written out here from Dynamo's source.

Two inputs of the comparison come from Dynamo's source, not its Python API: the per-block
multimodal objects (Dynamo keys an object in every block its span overlaps) and the identifier
to ``mm_hash`` map (``hash_mm_identifier``, ``lib/kv-router/src/protocols.rs`` @038eab2).
"""

from __future__ import annotations

import random
import struct

import pytest
import xxhash
from random_inputs import length, mm_items, seed, text, token_ids

from tokenkeys.keys import Adapter, KeyContext, MMItem, block_keys, make_spec

pytestmark = pytest.mark.peers

CASES = 400
BLOCK_SIZES = (1, 2, 3, 4, 7, 16, 32, 64)
_HEX = set("0123456789abcdefABCDEF")


def dynamo_mm_hash(identifier: str) -> int:
    """``hash_mm_identifier``: 64 hex digits keep the first 16, anything else XXH3-64 seed 0."""
    if len(identifier) == 64 and set(identifier) <= _HEX:
        return int(identifier[:16], 16)
    return xxhash.xxh3_64_intdigest(identifier.encode("utf-8"), 0)


def block_items(items: tuple[MMItem, ...], start: int, end: int) -> list[MMItem]:
    return [m for m in items if m.offset < end and m.end > start]


def random_case(rng: random.Random) -> dict:
    block_size = rng.choice(BLOCK_SIZES)
    tokens = token_ids(rng, length(rng, block_size))
    return {
        "tokens": tokens,
        "block_size": block_size,
        "lora_name": text(rng) if rng.random() < 0.4 else None,
        "cache_namespace": text(rng) if rng.random() < 0.4 else None,
        "mm_items": mm_items(rng, len(tokens)) if rng.random() < 0.5 else (),
    }


def dynamo_request(case: dict, rng: random.Random) -> dict:
    """The same request as Dynamo's Python API takes it: objects per block, in any order, with
    their offsets (which Dynamo carries but does not hash)."""
    bs = case["block_size"]
    infos = []
    for b in range(len(case["tokens"]) // bs):
        objects = [
            {"mm_hash": dynamo_mm_hash(m.identifier), "offsets": [[m.offset, m.end]]}
            for m in block_items(case["mm_items"], b * bs, (b + 1) * bs)
        ]
        rng.shuffle(objects)
        infos.append({"mm_objects": objects} if objects else None)
    return {
        "tokens": case["tokens"],
        "block_size": bs,
        "block_mm_infos": infos if any(infos) else None,
        "lora_name": case["lora_name"],
        "cache_namespace": case["cache_namespace"],
    }


def context(case: dict, items: tuple[MMItem, ...]) -> KeyContext:
    return KeyContext(
        adapter=Adapter(case["lora_name"]) if case["lora_name"] else None,
        cache_salt=case["cache_namespace"],
        mm_items=items,
    )


def next_sequence_hash(parent: int, local: int) -> int:
    return xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent, local), 1337)


def test_keys_equal_dynamo_block_hashes_on_random_requests(dynamo_peer) -> None:
    run_seed = seed()
    rng = random.Random(run_seed)
    cases = [random_case(rng) for _ in range(CASES)]
    locals_ = dynamo_peer.call("block_hashes", cases=[dynamo_request(c, rng) for c in cases])
    specs = {bs: make_spec("dynamo/xxh3@1.6", bs, vectors=False) for bs in BLOCK_SIZES}
    compared = 0
    for i, (case, local) in enumerate(zip(cases, locals_, strict=True)):
        where = f"seed {run_seed} case {i}: {case}"
        bs, tokens = case["block_size"], case["tokens"]
        spec = specs[bs]
        assert len(local) == len(tokens) // bs, where
        # Each block alone: its local hash.
        for b, expected in enumerate(local):
            here = block_items(case["mm_items"], b * bs, (b + 1) * bs)
            alone = tuple(MMItem(m.identifier, j, 1) for j, m in enumerate(here))
            (key,) = block_keys(tokens[b * bs : (b + 1) * bs], spec, context(case, alone))
            assert key.event_key == expected, f"block {b}, {where}"
        # The whole prompt: the sequence hashes over those local hashes.
        keys = block_keys(tokens, spec, context(case, case["mm_items"]))
        sequence = []
        for h in local:
            sequence.append(h if not sequence else next_sequence_hash(sequence[-1], h))
        assert [k.event_key for k in keys] == sequence, where
        assert [k.digest for k in keys] == [s.to_bytes(8, "big") for s in sequence], where
        compared += len(local)
    assert compared > CASES  # the random lengths did produce blocks to compare
