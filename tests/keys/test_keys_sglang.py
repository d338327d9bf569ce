"""SGLang page hashes (sglang 0.5.23 mem_cache/utils.py; the legacy get_hash_str)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.errors import Unsupported
from tokenkeys.keys import Adapter, KeyContext, MMItem, block_keys, make_spec
from tokenkeys.keys.compute import reference_block_keys
from tokenkeys.keys.sglang import SALT_SEED_TAG, int64_of

# Every test here twice: through the compiled key core and the pure-Python paths.
pytestmark = pytest.mark.usefixtures("key_core")

SPEC = make_spec("sglang/sha256@0.5.23", 4)


def test_page_hash_bytes() -> None:
    keys = block_keys([1, 2, 3, 4, 300, 70000, 5, 6, 9], SPEC)
    first = hashlib.sha256(bytes.fromhex("01000000020000000300000004000000")).digest()
    second = hashlib.sha256(
        first
        + (300).to_bytes(4, "little")
        + (70000).to_bytes(4, "little")
        + bytes.fromhex("0500000006000000")
    ).digest()
    assert [k.digest for k in keys] == [first, second]
    # hash_str_to_int64: the first 16 hex digits, signed.
    assert keys[0].event_key == int(first.hex()[:16], 16) - (2**64 if first[0] >= 0x80 else 0)
    assert int64_of(b"\xff" * 8) == -1


def test_salt_seeds_the_event_chain() -> None:
    keys = block_keys([1, 2, 3, 4], SPEC, KeyContext(cache_salt="t"))
    seed = hashlib.sha256(SALT_SEED_TAG + b"t").digest()
    assert (
        keys[0].digest
        == hashlib.sha256(seed + bytes.fromhex("01000000020000000300000004000000")).digest()
    )


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=60), st.integers(1, 8))
def test_fast_equals_reference(tokens: list[int], page: int) -> None:
    spec = make_spec("sglang/sha256@0.5.23", page, vectors=False)
    assert block_keys(tokens, spec) == reference_block_keys(tokens, spec)


def test_refusals() -> None:
    with pytest.raises(Unsupported, match="LoRA"):
        block_keys([1, 2, 3, 4], SPEC, KeyContext(adapter=Adapter("a")))
    with pytest.raises(Unsupported, match="multimodal"):
        block_keys([1, 2, 3, 4], SPEC, KeyContext(mm_items=(MMItem("i", 0, 1),)))
