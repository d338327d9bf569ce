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
import sys
from array import array
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

import cbor2

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


_NONZERO = bytes([0] + [1] * 255)
_AT_LEAST_24 = bytes([0] * 24 + [1] * 232)


def _encoded_widths(tokens: array) -> bytes:
    """Per token, the byte length of its canonical CBOR encoding (1, 2, 3 or 5), C-level only.

    The tokens' big-endian bytes are split into four byte lanes; big-integer ORs and
    ``bytes.translate`` turn them into per-token flags (>= 24, >= 256, >= 65536) without a
    Python-level step per token.
    """
    n = len(tokens)
    be = array("I", tokens)
    if sys.byteorder == "little":
        be.byteswap()
    raw = be.tobytes()
    lane = [int.from_bytes(raw[i::4], "little") for i in range(4)]
    ge65536 = int.from_bytes(
        (lane[0] | lane[1]).to_bytes(n, "little").translate(_NONZERO), "little"
    )
    ge256 = int.from_bytes(
        (lane[0] | lane[1] | lane[2]).to_bytes(n, "little").translate(_NONZERO), "little"
    )
    ge24 = ge256 | int.from_bytes(raw[3::4].translate(_AT_LEAST_24), "little")
    ones = int.from_bytes(b"\x01" * n, "little")
    # Each byte lane holds at most 1 + 1 + 1 + 2 = 5: no carries between lanes.
    return (ones + ge24 + ge256 + 2 * ge65536).to_bytes(n, "little")


def token_blocks(tokens: array, block_size: int) -> tuple[bytes, list[int]]:
    """Canonical CBOR of every token, concatenated, and the byte offset of each block.

    ``tokens`` holds whole blocks only. Block ``b`` is ``data[offsets[b]:offsets[b + 1]]``.
    The integers are encoded by cbor2's C encoder in one call; block boundaries come from
    :func:`_encoded_widths`, summed per block with one big-integer multiplication.
    """
    n = len(tokens)
    if n == 0:
        return b"", [0]
    data = cbor2.dumps(tokens.tolist(), canonical=True)[len(head(4, n)) :]
    widths = _encoded_widths(tokens)
    if block_size * 5 < 256:
        # Multiplying by 1 + 256 + ... + 256**(bs-1) puts each block's width sum in the byte at
        # the block's last position (sums stay below 256, so nothing carries).
        ones = int.from_bytes(b"\x01" * block_size, "little")
        product = (int.from_bytes(widths, "little") * ones).to_bytes(n + block_size, "little")
        sums = product[block_size - 1 : n : block_size]
    else:
        sums = [sum(widths[i : i + block_size]) for i in range(0, n, block_size)]
    offsets = [0, *accumulate(sums)]
    if offsets[-1] != len(data):  # pragma: no cover - guards the width arithmetic
        raise AssertionError("CBOR token widths disagree with the encoder output")
    return data, offsets
