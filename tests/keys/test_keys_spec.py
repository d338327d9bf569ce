"""CacheKeySpec: JSON round trip, fingerprint identity, registry listing, chain invariants."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.errors import FailedPrecondition, NotFound
from tokenkeys.keys import CacheKeySpec, block_keys, get_profile, list_profiles, make_spec
from tokenkeys.keys.registry import profile_ids

EXPECTED_IDS = {
    "dynamo/xxh3@1.6",
    "llmd/cbor-fnv64@0.10",
    "llmd/xxh64@c027acf",
    "sglang/sha256@0.5.23",
    *(
        f"vllm/{a}@{e}"
        for e in ("0.29", "0.31")
        for a in ("sha256_cbor", "sha256", "xxhash", "xxhash_cbor")
    ),
}


def test_registry_lists_every_profile() -> None:
    infos = list_profiles()
    assert {i.id for i in infos} == EXPECTED_IDS
    for info in infos:
        assert info.to_dict()["parameters"]
        assert info.client_computable == (
            info.algorithm not in ("sha256", "xxhash") or info.engine != "vllm"
        )


def test_unknown_profile_lists_known_ids() -> None:
    with pytest.raises(NotFound) as info:
        get_profile("vllm/sha256_cbor@0.99")
    for pid in profile_ids():
        assert pid in info.value.message


@pytest.mark.parametrize("profile_id", sorted(EXPECTED_IDS))
def test_json_round_trip_and_fingerprint(profile_id: str) -> None:
    seed = {"root_seed": "7"} if get_profile(profile_id).engine in ("vllm", "llmd") else {}
    spec = make_spec(profile_id, 16, **seed)
    again = CacheKeySpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.vectors == spec.vectors
    assert again.sealed().fingerprint == spec.fingerprint
    # Dropping the vector bodies keeps the identity; the digest stands for them.
    assert spec.without_vectors().sealed().fingerprint == spec.fingerprint
    assert len(spec.fingerprint) == 64


def test_fingerprint_changes_with_behaviour() -> None:
    a = make_spec("vllm/sha256_cbor@0.31", 16, vectors=False)
    assert (
        a.fingerprint
        != make_spec("vllm/sha256_cbor@0.31", 16, root_seed="1", vectors=False).fingerprint
    )
    assert a.fingerprint != make_spec("vllm/sha256_cbor@0.31", 32, vectors=False).fingerprint
    assert a.fingerprint == make_spec("vllm/sha256_cbor@0.31", 16, vectors=False).fingerprint


def test_spec_must_match_its_profile() -> None:
    spec = make_spec("sglang/sha256@0.5.23", 16, vectors=False)
    forged = CacheKeySpec.from_dict({**spec.to_dict(), "engine_version": "0.4"})
    with pytest.raises(FailedPrecondition):
        block_keys([1] * 16, forged)


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(sorted(EXPECTED_IDS)),
    st.lists(st.integers(0, 2**20), max_size=80),
    st.integers(0, 80),
)
def test_keys_are_prefix_stable(profile_id: str, tokens: list[int], cut: int) -> None:
    seed = {"root_seed": "1"} if get_profile(profile_id).engine in ("vllm", "llmd") else {}
    spec = make_spec(profile_id, 8, vectors=False, **seed)
    ctx = None
    if "model" in spec.required_context:
        from tokenkeys.keys import KeyContext

        ctx = KeyContext(model="m")
    full = block_keys(tokens, spec, ctx)
    prefix = block_keys(tokens[:cut], spec, ctx)
    assert full[: len(prefix)] == prefix
    assert len(full) == len(tokens) // 8


def test_a_sliding_window_group_carries_its_window_and_old_specs_keep_their_fingerprint():
    from tokenkeys.keys import make_spec

    plain = make_spec("vllm/sha256_cbor@0.31", 32)
    assert "sliding_window" not in plain.to_dict()["groups"][0]
    hybrid = make_spec(
        "vllm/sha256_cbor@0.31",
        None,
        groups=[
            {"kind": "sliding_window", "block_size": 32, "sliding_window": 64},
            {"kind": "full_attention", "block_size": 32},
        ],
    )
    assert hybrid.groups[0].sliding_window == 64
    assert CacheKeySpec.from_dict(hybrid.to_dict()) == hybrid
    assert hybrid.fingerprint != plain.fingerprint
