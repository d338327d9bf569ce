"""The hand-rolled canonical CBOR is byte-identical to cbor2.dumps(..., canonical=True)."""

from __future__ import annotations

import cbor2
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys.keys import cbor

leaf = st.none() | st.integers(-(2**64), 2**64 - 1) | st.binary(max_size=40) | st.text(max_size=20)
values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=5).map(tuple), max_leaves=20)


@given(values)
def test_encode_matches_cbor2(value: object) -> None:
    assert cbor.encode(value) == cbor2.dumps(value, canonical=True)


@given(st.lists(st.integers(0, 2**32 - 1), max_size=50))
def test_token_encodings_match_cbor2(tokens: list[int]) -> None:
    data, offsets = cbor.token_encodings(tokens)
    assert cbor.head(4, len(tokens)) + data == cbor2.dumps(tuple(tokens), canonical=True)
    assert offsets[0] == 0 and offsets[-1] == len(data) and len(offsets) == len(tokens) + 1


@given(st.lists(st.text(max_size=8), max_size=4))
def test_llmd_extra_maps_match_cbor2(ids: list[str]) -> None:
    value = [{"Hash": s} for s in ids]
    assert cbor.encode(value) == cbor2.dumps(value, canonical=True)


def test_vllm_doc_example() -> None:
    # vllm.md §1.2: (b'\xab'*32, (1,300,70000), None) -> 83 5820 ab.. 83 01 19012c 1a00011170 f6
    encoded = cbor.encode((b"\xab" * 32, (1, 300, 70000), None))
    assert encoded.hex() == "835820" + "ab" * 32 + "8301" + "19012c" + "1a00011170" + "f6"
