"""vLLM profiles: real engine hashes, the engine's NONE_HASH values, extra-key shapes, groups."""

from __future__ import annotations

import json

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.keys import (
    Adapter,
    KeyContext,
    MMItem,
    block_key_array,
    block_keys,
    get_profile,
    make_spec,
)
from tokenkeys.keys.compute import reference_block_keys

from conformance_data import data_path

# Every test here twice: through the compiled key core and the pure-Python paths.
pytestmark = pytest.mark.usefixtures("key_core")

VLLM_IDS = [
    f"vllm/{a}@{e}"
    for e in ("0.29", "0.31")
    for a in ("sha256_cbor", "sha256", "xxhash", "xxhash_cbor")
]


@pytest.mark.parametrize(
    ("name", "context"),
    [
        ("kv_event_base.json", None),
        # The engine ran the adapter registered as Alice=charent/self_cognition_Alice; the bare
        # era hashes the name only.
        (
            "kv_event_lora.json",
            KeyContext(adapter=Adapter("Alice", "charent/self_cognition_Alice")),
        ),
    ],
)
def test_real_vllm_engine_hashes(name: str, context: KeyContext | None) -> None:
    # tests/data/vectors/vllm-kv-events: BlockStored events of a real vLLM engine
    # (PYTHONHASHSEED=42, block_size 16, sha256_cbor), from llm-d-kv-cache-manager testdata.
    data = json.loads(data_path("vectors", "vllm-kv-events", name).read_text())
    spec = make_spec("vllm/sha256_cbor@0.29", data["block_size"], root_seed=data["hash_seed"])
    keys = block_keys(data["token_ids"], spec, context)
    assert [k.event_key for k in keys] == data["block_hashes"]
    assert len(keys) == 25
    assert block_key_array(data["token_ids"], spec, context).event_keys == data["block_hashes"]


def test_none_hash_values_pinned_by_vllm() -> None:
    # vLLM >= 0.29 init_none_hash: NONE_HASH = hash_fn("vllm-none-hash") without PYTHONHASHSEED,
    # hash_fn(PYTHONHASHSEED) with it (vllm/v1/core/kv_cache_utils.py, 0.29-0.33; values as
    # reference/engines/vllm.md §1.3 records them from the 0.33 wheel).
    cbor_spec = make_spec("vllm/sha256_cbor@0.31", 16)
    assert cbor_spec.root_hex == "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
    assert cbor_spec.root_derivation == "default_seed"
    pickle_spec = make_spec("vllm/sha256@0.31", 16)
    assert (
        pickle_spec.root_hex == "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
    )
    seeded = make_spec("vllm/sha256_cbor@0.31", 16, root_seed="0").root_hex
    assert seeded.startswith("4e1195df") and seeded.endswith("e61c3e")
    seeded = make_spec("vllm/sha256@0.31", 16, root_seed="0").root_hex
    assert seeded.startswith("1973e238") and seeded.endswith("14aa7c")


def test_cbor_root_is_hash_of_cbor_text_string() -> None:
    # sha256 of 6e 766c6c6d2d6e6f6e652d68617368 (vllm.md §1.3).
    assert cbor2.dumps("vllm-none-hash", canonical=True).hex() == "6e766c6c6d2d6e6f6e652d68617368"


def test_mm_extra_keys_match_vllm_example() -> None:
    # vLLM's own example for _gen_mm_extra_hash_keys: items img-A@5+20 and img-B@40+4, blocks
    # of 16 tokens -> (("mm","img-A",5),), (("mm","img-A",-11),), (("mm","img-B",8),).
    ctx = KeyContext(mm_items=(MMItem("img-A", 5, 20), MMItem("img-B", 40, 4)))
    tagged = get_profile("vllm/sha256_cbor@0.31")
    assert [tagged.extra_keys(ctx, b, 16 * b, 16 * b + 16) for b in range(3)] == [
        (("mm", "img-A", 5),),
        (("mm", "img-A", -11),),
        (("mm", "img-B", 8),),
    ]
    bare = get_profile("vllm/sha256_cbor@0.29")
    assert bare.extra_keys(ctx, 1, 16, 32) == (("img-A", -11),)


def test_extra_key_order_and_first_block_salt() -> None:
    digest = bytes(range(32))
    ctx = KeyContext(
        adapter=Adapter("lo", "/p"),
        cache_salt="s1",
        mm_items=(MMItem("m", 3, 2),),
        prompt_embeds_digests=(digest, digest),
    )
    tagged = get_profile("vllm/sha256_cbor@0.31")
    assert tagged.extra_keys(ctx, 0, 0, 16) == (
        ("lora", "lo", "/p"),
        ("mm", "m", 3),
        ("cache_salt", "s1"),
        ("prompt_embeds", digest),
    )
    assert tagged.extra_keys(ctx, 1, 16, 32) == (("lora", "lo", "/p"), ("prompt_embeds", digest))
    bare = get_profile("vllm/sha256_cbor@0.29")
    assert bare.extra_keys(ctx, 0, 0, 16) == ("lo", ("m", 3), "s1", digest)


def test_block_keys_equal_engine_formula() -> None:
    # hash_block_tokens: hash_fn((parent or NONE_HASH, tuple(tokens), extra_keys)).
    profile = get_profile("vllm/sha256_cbor@0.31")
    spec = make_spec("vllm/sha256_cbor@0.31", 4)
    keys = block_keys([0, 1, 2, 3, 4, 5, 6, 7, 8], spec)
    first = profile.hash_object((spec.root, (0, 1, 2, 3), None))
    second = profile.hash_object((first, (4, 5, 6, 7), None))
    assert [k.digest for k in keys] == [first, second]
    assert keys[1].event_key == int.from_bytes(second[-8:], "big")


@pytest.mark.parametrize("profile_id", VLLM_IDS)
@settings(max_examples=25, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=70),
    block_size=st.integers(1, 9),
    salt=st.none() | st.sampled_from(["a", "tenant-a"]),
    adapter=st.booleans(),
    mm=st.booleans(),
)
def test_fast_path_equals_engine_style_reference(
    profile_id: str, tokens: list[int], block_size: int, salt: str | None, adapter: bool, mm: bool
) -> None:
    spec = make_spec(profile_id, block_size, root_seed="42", vectors=False)
    ctx = KeyContext(
        adapter=Adapter("ad", "ad") if adapter else None,
        cache_salt=salt,
        mm_items=(MMItem("img", 2, 7), MMItem("img", 11, 1)) if mm else (),
    )
    fast = block_keys(tokens, spec, ctx)
    assert fast == reference_block_keys(tokens, spec, ctx)
    assert len(fast) == len(tokens) // block_size


def test_hybrid_groups_key_at_last_hash_unit() -> None:
    spec = make_spec("vllm/sha256_cbor@0.31", None, groups=[16, 32])
    assert spec.hash_unit == 16
    tokens = list(range(100))
    unit = block_keys(tokens, spec)
    group1 = block_keys(tokens, spec, KeyContext(group=1))
    assert len(unit) == 6 and group1 == [unit[1], unit[3], unit[5]]
    assert block_keys(tokens, spec, KeyContext(group=0)) == unit
    with pytest.raises(InvalidArgument, match="group 2"):
        block_keys(tokens, spec, KeyContext(group=2))
    with pytest.raises(InvalidArgument, match="not a multiple"):
        make_spec("vllm/sha256_cbor@0.31", 24, groups=[16, 32])


def test_continuation_from_parent_extends_the_chain() -> None:
    spec = make_spec("vllm/sha256_cbor@0.31", 8)
    tokens = list(range(40))
    full = block_keys(tokens, spec)
    assert block_keys(tokens[16:], spec, parent=full[1]) == full[2:]
    assert block_keys(tokens[16:], spec, KeyContext(parent=full[1].digest)) == full[2:]


@pytest.mark.parametrize("profile_id", ["vllm/sha256_cbor@0.31", "vllm/xxhash_cbor@0.29"])
def test_continuation_inside_a_multimodal_item(profile_id: str) -> None:
    # vLLM keys ("mm", id, offset - block_start) in every block an item overlaps; from a parent
    # at block k the item keeps its true start, k*U tokens earlier (a negative offset).
    spec = make_spec(profile_id, 8, root_seed="7")
    tokens = list(range(100, 148))
    whole = block_keys(tokens, spec, KeyContext(mm_items=(MMItem("img", 5, 30),)))
    for k in (1, 2, 3):
        ctx = KeyContext(mm_items=(MMItem("img", 5 - 8 * k, 30),), parent=whole[k - 1].digest)
        assert block_keys(tokens[8 * k :], spec, ctx) == whole[k:]
        assert reference_block_keys(tokens[8 * k :], spec, ctx) == whole[k:]


def test_refusals() -> None:
    with pytest.raises(InvalidArgument, match="PYTHONHASHSEED"):
        make_spec("vllm/xxhash_cbor@0.31", 16)
    spec = make_spec("vllm/sha256_cbor@0.31", 16)
    with pytest.raises(InvalidArgument, match="adapter path"):
        block_keys(list(range(16)), spec, KeyContext(adapter=Adapter("x")))
    with pytest.raises(InvalidArgument, match="prompt_embeds_digests"):
        block_keys(list(range(32)), spec, KeyContext(prompt_embeds_digests=(bytes(32),)))
    with pytest.raises(InvalidArgument, match="root_seed or root_hex"):
        make_spec("vllm/sha256_cbor@0.31", 16, root_seed="1", root_hex="00")
    with pytest.raises(InvalidArgument, match="token ids"):
        block_keys([1, -2], spec)
    with pytest.raises(InvalidArgument, match="block_size"):
        make_spec("vllm/sha256_cbor@0.31", 0)
    assert not get_profile("vllm/sha256@0.31").client_computable
    assert get_profile("vllm/xxhash_cbor@0.29").client_computable
    assert isinstance(Unsupported("x"), Exception)


def test_explicit_root_and_empty_prompt() -> None:
    spec = make_spec("vllm/xxhash@0.31", 4, root_hex="ab" * 32)
    assert spec.root == b"\xab" * 32 and spec.root_derivation == "explicit"
    assert block_keys([], spec) == []
    assert block_keys([1, 2, 3], spec) == []
    assert len(block_keys([1, 2, 3, 4], spec)[0].digest) == 16


@pytest.mark.parametrize("profile_id", ["vllm/sha256_cbor@0.31", "vllm/xxhash_cbor@0.29"])
@settings(max_examples=40, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=90),
    block_size=st.integers(1, 30),
    adapter=st.booleans(),
    salt=st.booleans(),
    items=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30)), max_size=3),
    embeds=st.booleans(),
    parent=st.booleans(),
    before=st.integers(0, 20),
)
def test_fast_path_with_every_extra_equals_reference(
    profile_id: str,
    tokens: list[int],
    block_size: int,
    adapter: bool,
    salt: bool,
    items: list[tuple[int, int]],
    embeds: bool,
    parent: bool,
    before: int,
) -> None:
    # Shared tails (adapter alone), per-block tails (items, embeddings), block 0's own tail
    # (salt) and continuation all go through the fast path's tail handling.
    spec = make_spec(profile_id, block_size, root_seed="3", vectors=False)
    # After a parent, items may start before the first given token (negative offsets).
    mm, end = [], -before if parent else 0
    for gap, length in items:
        mm.append(MMItem(f"img{len(mm)}", end + gap, length))
        end += gap + length
    n = len(tokens) // block_size
    ctx = KeyContext(
        adapter=Adapter("ad", "/ad") if adapter else None,
        cache_salt="s" if salt else None,
        mm_items=tuple(mm),
        prompt_embeds_digests=tuple(bytes([i % 256]) * 32 for i in range(n)) if embeds else (),
        parent=bytes(get_profile(profile_id).digest_size) if parent else None,
    )
    assert block_keys(tokens, spec, ctx) == reference_block_keys(tokens, spec, ctx)
