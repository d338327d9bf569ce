"""What the sidecar takes from vLLM when the options leave it unset (engine/vllm/adopt.py); the
real vLLM's side is tests/realengine/test_vllm_sidecar_start.py."""

from __future__ import annotations

import pytest

from tokenkeys.engine.vllm.adopt import adopted_spec, profile_for
from tokenkeys.errors import ConfigError
from tokenkeys.keys.deployment import DEFAULT_PROFILE, KeySpecOptions, build_spec

# vLLM 0.32's cache_config_info labels (the fields the adoption reads).
CACHE = {"block_size": "32", "prefix_caching_hash_algo": "sha256"}


@pytest.mark.parametrize(
    ("release", "profile"),
    [
        ("0.32.0", "vllm/xxhash_cbor@0.31"),
        ("0.31.1+cpu", "vllm/xxhash_cbor@0.31"),
        ("v0.33.0rc1", "vllm/xxhash_cbor@0.31"),
        ("0.30.2", "vllm/xxhash_cbor@0.29"),
        ("0.29.0", "vllm/xxhash_cbor@0.29"),
    ],
)
def test_the_profile_is_the_newest_not_after_the_release(release: str, profile: str) -> None:
    assert profile_for("xxhash_cbor", release) == profile


@pytest.mark.parametrize(("algorithm", "release"), [("sha256", "0.28.0"), ("blake3", "0.32.0")])
def test_no_known_profile_asks_for_the_option(algorithm: str, release: str) -> None:
    with pytest.raises(ConfigError, match="give --cache-key-profile") as refused:
        profile_for(algorithm, release)
    assert refused.value.field == "cache-key-profile"


def test_unset_options_take_vllms_and_given_ones_stay() -> None:
    default = build_spec(KeySpecOptions(DEFAULT_PROFILE))
    assert default is not None
    adopted = adopted_spec(default, KeySpecOptions(profile=None), CACHE, "0.32.0")
    assert (adopted.profile_id, adopted.hash_unit) == ("vllm/sha256@0.31", 32)
    # An adopted xxhash still needs vLLM's seed: its default root is random per process.
    xxhash = {**CACHE, "prefix_caching_hash_algo": "xxhash"}
    with pytest.raises(ConfigError, match="root"):
        adopted_spec(default, KeySpecOptions(profile=None), xxhash, "0.32.0")
    seeded = adopted_spec(default, KeySpecOptions(profile=None, root_seed="0"), xxhash, "0.32.0")
    assert seeded.profile_id == "vllm/xxhash@0.31"
    # Given: kept as given (the start checks then refuse a contradiction, naming both).
    given = KeySpecOptions(profile="vllm/sha256@0.31", block_size=16)
    spec = build_spec(given)
    assert spec is not None and adopted_spec(spec, given, CACHE, "0.32.0") is spec
    only_profile = KeySpecOptions(profile="vllm/sha256_cbor@0.31")
    partly = adopted_spec(default, only_profile, CACHE, "0.32.0")
    assert (partly.profile_id, partly.hash_unit) == ("vllm/sha256_cbor@0.31", 32)
