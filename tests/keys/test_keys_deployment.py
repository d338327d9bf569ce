"""build_spec: command-line cache-key options become exactly one spec, or a clear ConfigError."""

from __future__ import annotations

import pytest

from tokenkeys.errors import ConfigError
from tokenkeys.keys import make_spec
from tokenkeys.keys.deployment import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_PROFILE,
    KeySpecOptions,
    build_spec,
    parse_kv_groups,
)


def test_defaults_are_the_simulated_engines_vllm_spec() -> None:
    spec = build_spec(KeySpecOptions())
    assert spec is not None
    assert spec.profile_id == DEFAULT_PROFILE == "vllm/sha256_cbor@0.31"
    assert spec.hash_unit == DEFAULT_BLOCK_SIZE == 16
    assert spec.root_derivation == "default_seed"
    assert spec.fingerprint == make_spec(DEFAULT_PROFILE, 16).fingerprint
    assert build_spec(KeySpecOptions(profile="none")) is None
    assert build_spec(KeySpecOptions(profile=None)) is None


def test_root_and_block_size_options() -> None:
    seeded = build_spec(KeySpecOptions(profile="vllm/sha256_cbor@0.29", root_seed="42"))
    assert seeded.root_derivation == "seed:42"
    explicit = build_spec(KeySpecOptions(root_hex=seeded.root_hex, block_size=32))
    assert explicit.root == seeded.root and explicit.hash_unit == 32
    assert explicit.root_derivation == "explicit"


def test_kv_groups_make_a_hybrid_spec() -> None:
    assert parse_kv_groups("full_attention:16, sliding_window@64:48,32") == [
        {"kind": "full_attention", "block_size": 16},
        {"kind": "sliding_window", "block_size": 48, "sliding_window": 64},
        {"kind": "full_attention", "block_size": 32},
    ]
    spec = build_spec(KeySpecOptions(kv_groups="full_attention:32,sliding_window@64:48"))
    assert spec.hash_unit == 16  # gcd, as vLLM's hash_block_size without prefix_match_unit
    assert [(g.kind, g.block_size, g.sliding_window) for g in spec.groups] == [
        ("full_attention", 32, None),
        ("sliding_window", 48, 64),
    ]
    configured = build_spec(KeySpecOptions(kv_groups="32,64", block_size=32))
    assert configured.hash_unit == 32


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (KeySpecOptions(profile="vllm/sha256_cbor@9.9"), "known profiles: dynamo/xxh3@1.6"),
        (KeySpecOptions(root_seed="1", root_hex="ab"), "not both"),
        (KeySpecOptions(block_size=0), "greater than 0.*--block-size"),
        (KeySpecOptions(root_hex="zz"), "not valid hex.*--root-seed / --root-hex"),
        (KeySpecOptions(profile="vllm/xxhash_cbor@0.31"), "no reproducible default root"),
        (KeySpecOptions(profile="sglang/sha256@0.5.23", root_seed="1"), "has no root"),
        (KeySpecOptions(kv_groups="full_attention:16,Sliding:32"), "kv-groups entry 1"),
        (KeySpecOptions(kv_groups="sliding_window@:32"), "kv-groups entry 0"),
        (KeySpecOptions(kv_groups="sliding_window:32"), "without a window.*--kv-groups"),
        (KeySpecOptions(kv_groups="full_attention@64:32"), "only sliding_window groups"),
        (KeySpecOptions(kv_groups="full_attention:0"), "positive integer"),
        (KeySpecOptions(kv_groups="16,40", block_size=16), "not a multiple.*--kv-groups"),
        (KeySpecOptions(profile="dynamo/xxh3@1.6", kv_groups="16,32"), "one KV-cache group"),
    ],
)
def test_bad_options_are_config_errors(options: KeySpecOptions, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_spec(options)
