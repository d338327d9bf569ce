"""Canonical CBOR (RFC 8949 deterministic encoding) for the few shapes block keys hash.

vLLM's ``*_cbor`` hashes call ``cbor2.dumps(obj, canonical=True)`` and llm-d encodes with
fxamacker/cbor ``CanonicalEncOptions``; both give shortest-form heads and definite lengths for
the types used here (unsigned and negative ints, byte and text strings, arrays, ``null``, maps
with one text key). Encoding these by hand, with the token encodings computed once per call
instead of once per block, is what makes key computation fast; tests prove the bytes identical
to ``cbor2.dumps(..., canonical=True)``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import accumulate
from typing import Any

from tokenkeys.errors import InvalidArgument

NULL = b"\xf6"
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def head(major: int, n: int) -> bytes:
    """The shortest head for major type ``major`` (0-7) and argument ``n`` (0 <= n < 2**64)."""
    mt = major << 5
    if n < 24:
        return bytes((mt | n,))
    if n < 0x100:
        return bytes((mt | 24,)) + _U8.pack(n)
    if n < 0x10000:
        return bytes((mt | 25,)) + _U16.pack(n)
    if n < 0x100000000:
        return bytes((mt | 26,)) + _U32.pack(n)
    if n < 0x10000000000000000:
        return bytes((mt | 27,)) + _U64.pack(n)
    raise InvalidArgument(f"integer {n} does not fit in 64 bits; CBOR bignums are not used")


def encode_int(n: int) -> bytes:
    """A CBOR integer (major type 0 for n >= 0, 1 for n < 0)."""
    return head(0, n) if n >= 0 else head(1, -1 - n)


def encode(value: Any) -> bytes:
    """Canonical CBOR of None, int, bytes, str, tuple/list and single-level str-keyed maps."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return b"\xf5" if value else b"\xf4"
    if isinstance(value, int):
        return encode_int(value)
    if isinstance(value, bytes):
        return head(2, len(value)) + value
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return head(3, len(raw)) + raw
    if isinstance(value, (tuple, list)):
        return head(4, len(value)) + b"".join(encode(v) for v in value)
    if isinstance(value, Mapping):
        # Canonical (RFC 7049 §3.9) order: shorter encoded key first, then bytewise.
        items = sorted(((encode(k), encode(v)) for k, v in value.items()), key=_key_order)
        return head(5, len(items)) + b"".join(k + v for k, v in items)
    raise InvalidArgument(f"cannot CBOR-encode a {type(value).__name__} in a block key")


def _key_order(pair: tuple[bytes, bytes]) -> tuple[int, bytes]:
    return len(pair[0]), pair[0]


_TABLE_LIMIT = 1 << 18  # covers the vocabularies of current models (<= 262144 ids)


@lru_cache(maxsize=1)
def _uint_table() -> tuple[bytes, ...]:
    # Encodings of 0..2**18-1, built once on first use and shared by every call: a cache of
    # constants, not configuration. It lets the per-token work run as one C-level map().
    return tuple(head(0, n) for n in range(_TABLE_LIMIT))


def token_encodings(tokens: Sequence[int]) -> tuple[bytes, list[int]]:
    """All token encodings concatenated, and the cumulative byte offsets (offsets[0] == 0).

    Block ``b`` of size ``bs`` is ``data[offsets[b*bs]:offsets[(b+1)*bs]]``.
    """
    table = _uint_table()
    if not tokens:
        return b"", [0]
    if max(tokens) < _TABLE_LIMIT:
        parts = list(map(table.__getitem__, tokens))
    else:
        u32 = _U32.pack
        parts = [table[t] if t < _TABLE_LIMIT else b"\x1a" + u32(t) for t in tokens]
    offsets = [0, *accumulate(map(len, parts))]
    return b"".join(parts), offsets
