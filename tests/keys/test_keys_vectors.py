"""The checked-in testvectors/ are exactly what the generator writes, and verification works."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tokenkeys.errors import TokenkeysError
from tokenkeys.keys import KeyArray, KeyContext, block_key_array, make_spec
from tokenkeys.keys.registry import profile_ids
from tokenkeys.keys.spec import Vector
from tokenkeys.keys.vectors import file_name, verify_vectors, write_vectors

# Every test here twice: through the compiled key core and the pure-Python paths.
pytestmark = pytest.mark.usefixtures("key_core")

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


@pytest.mark.parametrize("profile_id", profile_ids())
def test_vectors_through_the_key_array(profile_id: str) -> None:
    # block_key_array gives every vector's keys (digests and event keys) or its error, as
    # block_keys does: the flat buffers the compiled chains write hold the same bytes.
    seed = {"root_seed": "9"} if profile_id.startswith(("vllm/xxhash",)) else {}
    spec = make_spec(profile_id, 16, **seed)
    for vector in spec.vectors:
        if vector.error is not None:
            with pytest.raises(TokenkeysError) as caught:
                ctx = KeyContext.from_dict(vector.context) if vector.context else None
                block_key_array(vector.tokens, spec, ctx)
            assert type(caught.value).__name__ == vector.error
            continue
        ctx = KeyContext.from_dict(vector.context) if vector.context else None
        keys = block_key_array(vector.tokens, spec, ctx)
        assert isinstance(keys, KeyArray)
        assert [k.hex for k in keys] == list(vector.keys or ()), vector.name
        assert keys.event_keys == list(vector.event_keys or ()), vector.name
        assert keys.index_keys.tolist() == [k % 2**64 for k in vector.event_keys or ()]


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


def _by_name(profile_id: str) -> dict[str, Vector]:
    from tokenkeys.keys.vectors import file_spec_params

    params = file_spec_params(profile_id)
    spec = make_spec(profile_id, params.pop("block_size"), **params)
    return {v.name: v for v in spec.vectors}


@pytest.mark.parametrize("profile_id", profile_ids())
def test_precise_cases_say_what_the_document_says(profile_id: str) -> None:
    """The cases added to settle docs/cache-keys.md questions hold the relations it states."""
    v = _by_name(profile_id)
    keys = {name: vec.keys for name, vec in v.items()}
    # Continuations (§1.2): chained from key k-1, the keys are the whole prompt's from k on.
    if keys["mm_crossing_boundary"] is not None:
        assert keys["mm_before_parent"] == keys["mm_crossing_boundary"][1:]
    assert keys["cache_salt_continuation"] == keys["cache_salt"][2:]
    for name in [n for n in v if n.startswith("group_") and n.endswith("_continuation")]:
        assert keys[name] == keys[name.removesuffix("_continuation")][1:]
    # Prompt embeddings (§2.4): digests past the last full block are not used.
    if keys["prompt_embeds"] is not None:
        assert keys["prompt_embeds_partial_tail"] == keys["prompt_embeds"]
        assert keys["prompt_embeds_prefix"] == keys["prompt_embeds"][:2]
        assert v["prompt_embeds_too_few"].error == "InvalidArgument"
    else:
        assert {v[n].error for n in ("prompt_embeds_partial_tail", "prompt_embeds_too_few")} == {
            "Unsupported"
        }
    for name in (
        "unknown_group",
        "parent_wrong_size",
        "token_out_of_range",
        "empty_cache_salt",
        "empty_adapter_name",
        "empty_mm_identifier",
        "empty_model",
        "mm_negative_offset_without_parent",
        "mm_overlapping",
    ):
        assert v[name].error == "InvalidArgument", name
    if profile_id.startswith("llmd/"):
        assert v["adapter_without_model"].error == "InvalidArgument"
    if profile_id.startswith("vllm/") and profile_id.endswith("@0.31"):
        assert v["adapter_name_only"].error == "InvalidArgument"


def test_dynamo_mm_order_and_hex_case() -> None:
    """Dynamo sorts a block's multimodal hashes ascending (u64), keeps repeats, and reads a
    64-hex identifier in either case as a processor hash (protocols.rs hash_mm_identifier:
    is_ascii_hexdigit, from_str_radix)."""
    from tokenkeys.keys import KeyContext, MMItem, block_keys
    from tokenkeys.keys.dynamo import mm_hash
    from tokenkeys.keys.vectors import MM_HEX_ID, MM_UUID

    v = _by_name("dynamo/xxh3@1.6")
    spec = make_spec("dynamo/xxh3@1.6", 16)
    crowded = v["mm_sorted_in_block"]
    items = [m["identifier"] for m in crowded.context["mm_items"]]
    hashes = [mm_hash(i) for i in items]
    assert items == [MM_UUID, MM_HEX_ID, MM_UUID] and hashes != sorted(hashes)
    upper = v["mm_hex_upper"]
    item = upper.context["mm_items"][0]
    lower = KeyContext(mm_items=(MMItem(item["identifier"].lower(), item["offset"], 16),))
    assert [k.hex for k in block_keys(upper.tokens, spec, lower)] == list(upper.keys)
    # vLLM hashes the identifier text as given, so the case matters there.
    vspec = make_spec("vllm/sha256_cbor@0.29", 16)
    vllm = _by_name("vllm/sha256_cbor@0.29")["mm_hex_upper"]
    assert [k.hex for k in block_keys(vllm.tokens, vspec, lower)] != list(vllm.keys)
