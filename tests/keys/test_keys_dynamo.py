"""Dynamo KV-router hashes, checked against values of Dynamo's own code.

* ``compute_block_hash(b"test data") == 13226331709069118873``: pinned in
  ai-dynamo/dynamo lib/kv-router/src/protocols.rs tests (@038eab2).
* The block hashes below were produced by ``dynamo._core.compute_block_hash_for_seq`` of the
  ai-dynamo-runtime 1.6.1 wheel (the compiled kv-router), with the arguments shown.
"""

from __future__ import annotations

import pytest
import xxhash

from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.keys import Adapter, KeyContext, MMItem, block_keys, make_spec
from tokenkeys.keys.compute import reference_block_keys
from tokenkeys.keys.dynamo import XXH3_SEED, mm_hash, next_sequence_hash

# Every test here twice: through the compiled key core and the pure-Python paths.
pytestmark = pytest.mark.usefixtures("key_core")

SPEC = make_spec("dynamo/xxh3@1.6", 16)


def check(tokens: list[int], ctx: KeyContext | None, expected_local: list[int]) -> None:
    keys = block_keys(tokens, SPEC, ctx)
    assert keys == reference_block_keys(tokens, SPEC, ctx)
    seq = expected_local[0]
    assert keys[0].event_key == seq
    for key, local in zip(keys[1:], expected_local[1:], strict=True):
        seq = next_sequence_hash(seq, local)
        assert key.event_key == seq
        assert key.digest == seq.to_bytes(8, "big")


def test_block_hash_seed_pinned_by_dynamo_tests() -> None:
    assert xxhash.xxh3_64_intdigest(b"test data", XXH3_SEED) == 13226331709069118873


def test_plain_adapter_and_namespace() -> None:
    tokens = list(range(1, 33))
    # compute_block_hash_for_seq(range(1, 33), 16[, lora_name=..., cache_namespace=...])
    check(tokens, None, [16863443419780771464, 2287610619914608821])
    check(
        tokens, KeyContext(adapter=Adapter("Alice")), [17434366942052329122, 13660096614006720863]
    )
    check(tokens, KeyContext(cache_salt="ns"), [15828369142348500699, 12569156846621718497])
    check(
        list(range(100000, 100040)),
        KeyContext(adapter=Adapter("a")),
        [1944425669610583863, 14788942347936065715],
    )


def test_multimodal_hashes_sorted_and_appended() -> None:
    tokens = list(range(1, 33))
    # block_mm_infos=[{"mm_objects": [{"mm_hash": 0xBBBB}, {"mm_hash": 0xAAAA}]}, None]
    a, b = "000000000000aaaa" + "0" * 48, "000000000000bbbb" + "0" * 48
    assert (mm_hash(a), mm_hash(b)) == (0xAAAA, 0xBBBB)
    items = (MMItem(b, 0, 3), MMItem(a, 5, 2))
    check(tokens, KeyContext(mm_items=items), [12933811761993568867, 2287610619914608821])
    check(
        tokens,
        KeyContext(mm_items=items, adapter=Adapter("Alice"), cache_salt="tenant-1"),
        [13708716217482645181, 9152680441245877599],
    )
    assert mm_hash("img") == xxhash.xxh3_64_intdigest(b"img", 0)


def test_continuation_and_refusals() -> None:
    tokens = list(range(64))
    full = block_keys(tokens, SPEC)
    assert block_keys(tokens[32:], SPEC, parent=full[1]) == full[2:]
    with pytest.raises(InvalidArgument, match="8-byte"):
        block_keys(tokens, SPEC, parent=b"\x01" * 32)
    with pytest.raises(Unsupported):
        block_keys(tokens, SPEC, KeyContext(prompt_embeds_digests=(bytes(32),) * 4))
    with pytest.raises(InvalidArgument, match="no root"):
        make_spec("dynamo/xxh3@1.6", 16, root_seed="x")
