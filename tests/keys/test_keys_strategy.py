"""Client key strategy: local only when every vector passes; remote or refusal otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from tokenkeys.errors import Unsupported
from tokenkeys.keys import BlockKey, CacheKeySpec, block_keys, make_spec
from tokenkeys.keys.strategy import KeyRequest, KeyStrategy


class RecordingRemote:
    """A remote computer that computes with the authoritative code and records its calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def compute(self, spec: CacheKeySpec, requests: Sequence[KeyRequest]) -> list[list[BlockKey]]:
        self.calls.append(len(requests))
        return [block_keys(r.tokens, spec, r.context) for r in requests]


TOKENS = list(range(50))


def test_local_when_vectors_pass() -> None:
    spec = make_spec("vllm/sha256_cbor@0.31", 16)
    remote = RecordingRemote()
    strategy = KeyStrategy(spec.to_dict(), remote)
    assert strategy.decision.mode == "local"
    assert "vectors" in strategy.decision.reason
    assert strategy.compute(TOKENS) == block_keys(TOKENS, spec)
    # The array form is block_key_array's: the same keys, no object per block.
    assert strategy.compute_array(TOKENS) == block_keys(TOKENS, spec)
    assert remote.calls == []


def test_pickle_profile_goes_remote() -> None:
    spec = make_spec("vllm/sha256@0.31", 16)
    remote = RecordingRemote()
    strategy = KeyStrategy(spec, remote)
    assert strategy.decision.mode == "remote"
    assert "not client-computable" in strategy.decision.reason
    assert strategy.compute_many([KeyRequest(TOKENS), KeyRequest(TOKENS[:20])]) == [
        block_keys(TOKENS, spec),
        block_keys(TOKENS[:20], spec),
    ]
    assert remote.calls == [2]
    # No array from the engine's keys: the caller asks compute() in that mode.
    with pytest.raises(Unsupported, match="remote"):
        strategy.compute_array(TOKENS)


def test_unknown_profile_and_failing_vectors() -> None:
    spec = make_spec("sglang/sha256@0.5.23", 16)
    unknown = {**spec.to_dict(), "profile_id": "sglang/sha256@9.9"}
    strategy = KeyStrategy(unknown, RecordingRemote())
    assert (
        strategy.decision.mode == "remote"
        and "unknown cache-key profile" in strategy.decision.reason
    )
    # A vector the local code does not reproduce (re-sealed, so only the vector is wrong).
    vectors = list(spec.vectors)
    vectors[2] = replace(vectors[2], event_keys=(1, 2, 3))
    tampered = spec.with_vectors(tuple(vectors))
    strategy = KeyStrategy(tampered, RecordingRemote())
    assert strategy.decision.mode == "remote"
    assert strategy.decision.report is not None and not strategy.decision.report.passed
    # Vectors that disagree with the digest the spec was sealed with.
    strategy = KeyStrategy(replace(spec, vectors=tuple(vectors)), RecordingRemote())
    assert "vectors_digest" in strategy.decision.reason


def test_strict_and_refused() -> None:
    spec = make_spec("vllm/xxhash@0.31", 16, root_seed="1")
    with pytest.raises(Unsupported, match="strict"):
        KeyStrategy(spec, RecordingRemote(), strict=True)
    refused = KeyStrategy(spec)
    assert refused.decision.mode == "refused"
    with pytest.raises(Unsupported, match="no remote key computer"):
        refused.compute(TOKENS)
    cbor_spec = make_spec("vllm/xxhash_cbor@0.31", 16, root_seed="1")
    no_vectors = KeyStrategy(cbor_spec.without_vectors().to_dict(include_vectors=False))
    assert "no test vectors" in no_vectors.decision.reason
    assert KeyStrategy({"profile_id": "x"}).decision.mode == "refused"


@pytest.mark.parametrize(
    ("profile_id", "change", "field"),
    [
        # root_hex that is not H(seed), a rule that is not the profile's, ...
        ("vllm/sha256_cbor@0.31", {"root_hex": "ab" * 32}, "root_hex"),
        ("vllm/sha256_cbor@0.31", {"root_derivation": "seed:1"}, "root_hex"),
        ("vllm/sha256_cbor@0.31", {"extra_keys": "vllm_bare"}, "extra_keys"),
        ("llmd/cbor-fnv64@0.10", {"root_derivation": "explicit"}, "root_hex"),
        ("llmd/cbor-fnv64@0.10", {"required_context": ()}, "required_context"),
        ("dynamo/xxh3@1.6", {"root_hex": "00" * 8}, "root"),
        ("sglang/sha256@0.5.23", {"root_derivation": "mystery"}, "root_derivation"),
    ],
)
def test_spec_that_contradicts_its_profile_is_not_used_locally(
    profile_id: str, change: dict, field: str
) -> None:
    from tokenkeys.errors import FailedPrecondition
    from tokenkeys.keys.compute import check_spec

    good = make_spec(profile_id, 16)
    assert check_spec(good).id == profile_id
    bad = replace(good, **change).sealed()  # intact fingerprint: only the profile check catches it
    with pytest.raises(FailedPrecondition, match=field):
        check_spec(bad)
    strategy = KeyStrategy(bad.to_dict())
    assert strategy.decision.mode == "refused" and field in strategy.decision.reason
