"""The checked-in testvectors/ are exactly what the generator writes, and verification works."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tokenkeys.keys import make_spec
from tokenkeys.keys.registry import profile_ids
from tokenkeys.keys.spec import Vector
from tokenkeys.keys.vectors import file_name, verify_vectors, write_vectors

REPO = Path(__file__).resolve().parents[2]


def test_checked_in_vectors_match_regeneration(tmp_path: Path) -> None:
    written = write_vectors(tmp_path)
    checked_in = REPO / "testvectors"
    assert sorted(p.name for p in written) == sorted(p.name for p in checked_in.glob("*.json")), (
        "testvectors/ lists other profiles; regenerate with write_vectors('testvectors')"
    )
    for path in written:
        assert path.read_text() == (checked_in / path.name).read_text(), (
            f"testvectors/{path.name} is stale; regenerate it with write_vectors('testvectors')"
        )


def test_file_names_are_safe() -> None:
    for pid in profile_ids():
        name = file_name(pid)
        assert "/" not in name and "@" not in name


@pytest.mark.parametrize("profile_id", profile_ids())
def test_vectors_cover_the_cases_and_verify(profile_id: str) -> None:
    seed = {"root_seed": "9"} if profile_id.startswith(("vllm/xxhash",)) else {}
    spec = make_spec(profile_id, 16, **seed)
    names = {v.name for v in spec.vectors}
    assert {
        "empty_prompt",
        "under_one_block",
        "exact_multiple",
        "partial_tail",
        "long_prompt",
        "cache_salt",
        "adapter",
        "mm_crossing_boundary",
        "mm_on_boundary",
        "prompt_embeds",
        "continuation",
    } <= names
    long = next(v for v in spec.vectors if v.name == "long_prompt")
    assert len(long.tokens) >= 2048
    assert verify_vectors(spec).passed


def test_verify_reports_first_mismatch() -> None:
    spec = make_spec("vllm/sha256_cbor@0.31", 16)
    vectors = list(spec.vectors)
    i = next(i for i, v in enumerate(vectors) if v.name == "exact_multiple")
    bad = vectors[i]
    vectors[i] = replace(bad, keys=("00" * 32, *(bad.keys or ())[1:]))
    report = verify_vectors(replace(spec, vectors=tuple(vectors)))
    assert not report.passed and "exact_multiple" in (report.first_failure or "")
    assert "key 0" in (report.first_failure or "")
    err = replace(bad, keys=None, event_keys=None, error="Unsupported")
    report = verify_vectors(replace(spec, vectors=(err,)))
    assert not report.passed and "expected error" in (report.first_failure or "")
    assert not verify_vectors(replace(spec, vectors=())).passed
    assert isinstance(vectors[0], Vector)
