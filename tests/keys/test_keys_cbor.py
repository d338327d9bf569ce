"""The hand-rolled canonical CBOR is byte-identical to cbor2.dumps(..., canonical=True)."""

from __future__ import annotations

from array import array

import cbor2
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys.keys import cbor

leaf = st.none() | st.integers(-(2**64), 2**64 - 1) | st.binary(max_size=40) | st.text(max_size=20)
values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=5).map(tuple), max_leaves=20)


@given(values)
def test_encode_matches_cbor2(value: object) -> None:
    assert cbor.encode(value) == cbor2.dumps(value, canonical=True)


@given(st.lists(st.integers(0, 2**32 - 1), max_size=60), st.integers(1, 70))
def test_token_blocks_match_cbor2(tokens: list[int], block_size: int) -> None:
    whole = tokens[: len(tokens) // block_size * block_size]
    data, offsets = cbor.token_blocks(array("I", whole), block_size)
    assert cbor.head(4, len(whole)) + data == cbor2.dumps(tuple(whole), canonical=True)
    assert len(offsets) == len(whole) // block_size + 1
    for b in range(len(offsets) - 1):
        block = tuple(whole[b * block_size : (b + 1) * block_size])
        expected = cbor2.dumps(block, canonical=True)[len(cbor.head(4, block_size)) :]
        assert data[offsets[b] : offsets[b + 1]] == expected


def test_token_widths_at_every_boundary() -> None:
    edges = [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1] * 4
    data, offsets = cbor.token_blocks(array("I", edges), 8)
    assert cbor.head(4, len(edges)) + data == cbor2.dumps(tuple(edges), canonical=True)
    assert offsets == [0, 22, 44, 66, 88]  # 1+1+2+2+3+3+5+5 bytes per block


@given(st.lists(st.text(max_size=8), max_size=4))
def test_llmd_extra_maps_match_cbor2(ids: list[str]) -> None:
    value = [{"Hash": s} for s in ids]
    assert cbor.encode(value) == cbor2.dumps(value, canonical=True)


def test_vllm_doc_example() -> None:
    # vllm.md §1.2: (b'\xab'*32, (1,300,70000), None) -> 83 5820 ab.. 83 01 19012c 1a00011170 f6
    encoded = cbor.encode((b"\xab" * 32, (1, 300, 70000), None))
    assert encoded.hex() == "835820" + "ab" * 32 + "8301" + "19012c" + "1a00011170" + "f6"
