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
from array import array
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

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


# Per width class (token < 24, < 2**8, < 2**16, < 2**32), which of the five bytes
# ``head, b3, b2, b1, b0`` (the head, then the token as big-endian u32) the encoding keeps.
# Everything about a token's encoding follows from its head byte: the token itself below 24,
# else 0x18, 0x19, 0x1a for 1, 2, 4 following bytes. _HEAD maps min(token, 65536) to it.
_HEAD = np.concatenate([np.arange(24), np.full(232, 0x18), np.full(65280, 0x19), [0x1A]]).astype(
    np.uint8
)
# Per head byte, which of the five slot bytes ``head, b3, b2, b1, b0`` (the head, then the token
# as big-endian u32) the shortest encoding keeps, and how many bytes it has (as float32: the
# per-block sums are one BLAS matrix-vector product, exact far below 2**24).
_KEEP = np.array(
    [[1, 0, 0, 0, 0]] * 24 + [[1, 0, 0, 0, 1], [1, 0, 0, 1, 1], [1, 1, 1, 1, 1]], dtype=np.bool_
)
_WIDTH = _KEEP.sum(axis=1).astype(np.float32)
# One token slot: the head byte, then the full value as big-endian u32 (packed, 5 bytes).
_SLOT = np.dtype([("head", "u1"), ("value", ">u4")])


def token_blocks(
    tokens: array, block_size: int, pre: bytes = b"", post: bytes = b""
) -> tuple[bytes, list[int]]:
    """Canonical CBOR of every token, block by block, each block framed by ``pre``/``post``.

    Block ``b`` (``pre``, the CBOR of its tokens, ``post``) is ``data[offsets[b]:offsets[b+1]]``;
    a trailing partial block is ignored. Vectorized with numpy: every token gets a 5-byte slot
    (head, big-endian u32), a per-token keep mask drops the bytes its shortest form does not
    use, and one compaction yields the buffer; block offsets are per-block sums of the widths
    (1, 2, 3 or 5). Tests prove the bytes equal ``cbor2.dumps(..., canonical=True)``.
    """
    n_blocks = len(tokens) // block_size
    if n_blocks == 0:
        return b"", [0]
    n = n_blocks * block_size
    t = np.frombuffer(tokens, dtype=np.uint32, count=n)
    head = _HEAD.take(np.minimum(t, 0x10000)).reshape(n_blocks, block_size)
    layout = _layout(block_size, pre, post)
    rows = np.empty(n_blocks, layout.rows)
    # Keep flags: 1 everywhere (pre, post), then the token slots' flags by head byte.
    keep = np.ones(n_blocks * layout.rows.itemsize, np.bool_).view(layout.keep)
    if pre:
        rows["pre"] = layout.pre
    if post:
        rows["post"] = layout.post
    slots = rows["tok"]
    slots["value"] = t.reshape(n_blocks, block_size)
    slots["head"] = head
    keep["tok"] = _KEEP.take(head, axis=0)
    # The kept positions are valid indices by construction, so the gather skips bounds checks.
    data = rows.view(np.uint8).take(np.flatnonzero(keep.view(np.bool_)), mode="clip").tobytes()
    sizes = (_WIDTH.take(head) @ layout.ones).astype(np.int64)
    sizes += len(pre) + len(post)
    offsets = [0, *np.cumsum(sizes).tolist()]
    if offsets[-1] != len(data):  # pragma: no cover - guards the width arithmetic
        raise AssertionError("CBOR token widths disagree with the encoded bytes")
    return data, offsets


class _Layout(NamedTuple):
    rows: np.dtype
    keep: np.dtype
    pre: np.ndarray
    post: np.ndarray
    ones: np.ndarray


@lru_cache(maxsize=64)
def _layout(block_size: int, pre: bytes, post: bytes) -> _Layout:
    """Structured row types of one block: ``pre`` bytes, 5-byte token slots, ``post`` bytes."""
    rows: list[tuple] = [("tok", _SLOT, (block_size,))]
    keep: list[tuple] = [("tok", np.bool_, (block_size, 5))]
    if pre:
        rows.insert(0, ("pre", np.uint8, (len(pre),)))
        keep.insert(0, ("pre", np.bool_, (len(pre),)))
    if post:
        rows.append(("post", np.uint8, (len(post),)))
        keep.append(("post", np.bool_, (len(post),)))
    return _Layout(
        np.dtype(rows),
        np.dtype(keep),
        np.frombuffer(pre, np.uint8),
        np.frombuffer(post, np.uint8),
        np.ones(block_size, dtype=np.float32),
    )
