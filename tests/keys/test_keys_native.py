"""The compiled key core against the pure-Python paths, hashlib and xxhash.

The other key modules run every test through both paths (``key_core`` in conftest.py); this one
compares them directly: on random workloads with every extra a profile supports, on the digest
functions the core carries itself (its SHA-256, on SHA-NI and portable), and the switch that
turns it off.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from array import array

import pytest
import xxhash
from evidence import unavailable
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.keys import (
    Adapter,
    KeyContext,
    MMItem,
    block_key_array,
    block_keys,
    get_profile,
    make_spec,
    native,
)
from tokenkeys.keys.compute import reference_block_keys
from tokenkeys.keys.registry import profile_ids
from tokenkeys.keys.spec import BlockKey

from support import REPO

COMPUTABLE = [p for p in profile_ids() if get_profile(p).client_computable]


@pytest.fixture(scope="module")
def core():
    """The extension module (skipped where not built, failed under CI)."""
    if native.CORE is None:
        unavailable(f"the compiled key core is not built here ({native.describe()})")
    return native.CORE


def _spec(profile_id: str, block_size: int):
    engine = get_profile(profile_id).engine
    seed = {"root_seed": "7"} if engine in ("vllm", "llmd") else {}
    return make_spec(profile_id, block_size, vectors=False, **seed)


def _context(profile_id: str, adapter: bool, salt: bool, items, parent: bool) -> KeyContext:
    """The extras ``profile_id`` supports, as drawn (the others left out, not refused)."""
    profile = get_profile(profile_id)
    supports = set(profile.parameters()["supports"])
    mm, end = [], 0
    for gap, length in items:
        mm.append(MMItem(f"{len(mm):064x}" if len(mm) % 2 else f"img{len(mm)}", end + gap, length))
        end += gap + length
    digest = {"vllm": getattr(profile, "digest_size", 0), "sglang": 32}.get(profile.engine, 8)
    return KeyContext(
        model="m" if profile.engine == "llmd" else None,
        adapter=Adapter("ad", "/ad") if adapter and "adapter" in supports else None,
        cache_salt="tenant" if salt and "cache_salt" in supports else None,
        mm_items=tuple(mm) if "mm_items" in supports else (),
        parent=bytes(range(digest)) if parent else None,
    )


@pytest.mark.parametrize("profile_id", COMPUTABLE)
@settings(max_examples=40, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=120)
    | st.lists(st.integers(0, 300), max_size=120),
    block_size=st.integers(1, 33),
    adapter=st.booleans(),
    salt=st.booleans(),
    items=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30)), max_size=3),
    parent=st.booleans(),
)
def test_compiled_equals_python_and_reference(
    core, profile_id, tokens, block_size, adapter, salt, items, parent
) -> None:
    spec = _spec(profile_id, block_size)
    ctx = _context(profile_id, adapter, salt, items, parent)
    compiled = block_keys(tokens, spec, ctx)
    compiled_array = block_key_array(tokens, spec, ctx)
    native.CORE = None  # (hypothesis refuses monkeypatch: restored by hand)
    try:
        python = block_keys(tokens, spec, ctx)
        python_array = block_key_array(tokens, spec, ctx)
    finally:
        native.CORE = core
    assert compiled == python == reference_block_keys(tokens, spec, ctx)
    # The flat buffers, written by the chains without a Python object per block, and packed
    # from the Python path's list: the same keys, the same bytes.
    assert compiled_array == python_array == compiled
    assert compiled_array.digests == python_array.digests
    assert compiled_array.events == python_array.events
    assert compiled_array.index_keys.tolist() == [k.event_key % 2**64 for k in compiled]
    assert all(type(k) is BlockKey for k in compiled)
    assert len(compiled) == len(tokens) // block_size


@pytest.mark.parametrize("profile_id", COMPUTABLE)
def test_every_profile_runs_in_c(core, profile_id: str) -> None:
    # A profile whose chain silently stayed in Python would pass the equality tests: each one's
    # compiled chain is reached (xxhash profiles where xxhash's entry points were found).
    needs_xxhash = "xx" in profile_id
    if needs_xxhash and not core.XXHASH:
        unavailable("xxhash's C entry points were not found in the xxhash package")
    assert native.chains(xxhash=needs_xxhash) is core


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=400), seed=st.integers(0, 2**64 - 1))
def test_digests_equal_hashlib_and_xxhash(core, data: bytes, seed: int) -> None:
    assert core.digest("sha256", data) == hashlib.sha256(data).digest()
    if core.XXHASH:
        assert core.digest("xxh3_128", data) == xxhash.xxh3_128_digest(data)
        assert core.digest(f"xxh3_64:{seed}", data) == xxhash.xxh3_64_digest(data, seed)
        assert core.digest(f"xxh64:{seed}", data) == xxhash.xxh64_digest(data, seed)


_CHILD = """
import hashlib, sys
from tokenkeys.keys import native
core = native.CORE
print(native.describe())
if core is not None:
    for n in range(0, 300):
        data = bytes(range(256)) * 2
        assert core.digest("sha256", data[:n]) == hashlib.sha256(data[:n]).digest(), n
"""


def _child(**env: str) -> str:
    run = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return run.stdout.strip()


def test_portable_sha256_equals_hashlib(core) -> None:
    # TOKENKEYS_SHA_NI=0 makes the core use its portable compression even on SHA-NI CPUs.
    assert _child(TOKENKEYS_SHA_NI="0").startswith("C (SHA-256 portable")


def test_environment_switch_keeps_python() -> None:
    assert _child(TOKENKEYS_NATIVE="0") == "pure Python (TOKENKEYS_NATIVE=0)"


def test_key_array_reads_as_the_list() -> None:
    spec = _spec("vllm/sha256_cbor@0.31", 4)
    tokens = list(range(30))
    keys = block_keys(tokens, spec)
    array_ = block_key_array(tokens, spec)
    assert len(array_) == len(keys) == 7
    assert array_[0] == keys[0] and array_[-1] == keys[-1] and list(array_) == keys
    assert array_[2:5] == keys[2:5] and array_[1::3] == keys[1::3] and array_[5:2] == []
    assert array_.tolist() == keys and array_ != keys[:-1]
    with pytest.raises(IndexError):
        array_[7]


def test_bad_buffers_are_refused(core) -> None:
    spec = _spec("vllm/sha256_cbor@0.31", 4)
    with pytest.raises(TypeError, match="uint32"):
        core.vllm_cbor(BlockKey, array("H", range(8)), 4, spec.root, b"\xf6", b"\xf6", None, True)
    with pytest.raises(ValueError, match="block size"):
        core.sglang(BlockKey, array("I", range(8)), 0, b"")
    with pytest.raises(TypeError, match="tuple subclass"):
        core.sglang(dict, array("I", range(8)), 4, b"")


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**32 - 1) | st.integers(0, 2**30 - 1), max_size=50))
def test_token_lists_read_in_c_equal_array(core, tokens: list[int]) -> None:
    # Ints of one 30-bit digit are read in place, larger ones through the C API: both equal
    # array("I"), for lists and tuples.
    for given_ in (tokens, tuple(tokens)):
        out = array("I", [0]) * len(tokens)
        assert core.u32_into(given_, out) is True
        assert out == array("I", tokens)


@pytest.mark.parametrize("bad", [-1, 2**32, 2**70, -(2**40), 1.0, True, "1", None])
def test_token_lists_with_anything_else_go_to_python(core, bad: object) -> None:
    # False: the caller's own conversion runs and names the bad token (or, for a bool, accepts
    # it as array("I") does).
    assert core.u32_into([1, bad, 2], array("I", [0, 0, 0])) is False
    assert core.u32_into(iter([1]), array("I", [0])) is False
    with pytest.raises(ValueError, match="length"):
        core.u32_into([1, 2], array("I", [0]))
