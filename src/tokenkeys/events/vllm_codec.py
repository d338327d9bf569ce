"""vLLM's msgpack KV-event codec: map-encoded events (vLLM >= 0.24) and positional ones (<= 0.23).

Checked against vLLM 0.33.0 (`vllm/distributed/kv_events.py`), whose publisher encodes with
``msgspec.msgpack.Encoder()``:

- The batch is an array ``[ts (float64), [event, ...], data_parallel_rank]``; msgspec writes all
  three elements of the ``array_like`` batch, a None rank as nil.
- Since vLLM 0.24 (PR #42892) each event is a map: ``"type": <class name>`` first, then the
  fields in declaration order, ``omit_defaults``: the fields without a default
  (``block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name`` and
  ``block_hashes, medium`` for BlockRemoved) are always written, defaulted fields only when not
  None. msgspec picks the map header by the struct's field count, not the count written, so
  0.33's 16-entry BlockStored gets a map16 header (``de 00 0b``) even for 11 entries.
- Up to vLLM 0.23 each event is a tagged array ``["BlockStored", f1, f2, ...]`` carrying every
  field of that release positionally (``vllm_layout`` has the field lists by release).

The encoder writes through msgspec structs shaped as vLLM's (``vllm_structs``), so its bytes
are vLLM's; the tests also compare them with a hand-written 0.33 payload. The decoder accepts
both event forms, and a map-encoded batch, ignores unknown map keys and extra trailing fields,
fills missing trailing fields with None, keeps hashes >= 2**63 unsigned, and counts what it
drops (unknown event types, malformed events) in :class:`DecodeStats` instead of failing the
batch. A payload that is not an event batch at all raises
:class:`~tokenkeys.errors.InvalidArgument`. Payloads in vLLM's exact form take a strict decoder
in C (``vllm_structs.decode_strict``); only the others are walked here in Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from tokenkeys.errors import InvalidArgument
from tokenkeys.events.model import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeStats,
    EventBatch,
    KvEvent,
    SpecRef,
)
from tokenkeys.events.vllm_layout import (
    DEFAULT_VERSION,
    REMOVED_ARRAY_FIELDS,
    REMOVED_FIELDS,
    STORED_ARRAY_FIELDS,
    STORED_FIELDS,
    layout_for,
)
from tokenkeys.events.vllm_structs import batch_encoder, decode_strict, encode_batch

__all__ = ["DEFAULT_VERSION", "VllmMsgpackCodec", "encode", "encode_batch", "layout_for"]

_U64_LIMIT = 1 << 64
_INT_TYPES = frozenset({int})
_I64_MIN = -(1 << 63)


class _Malformed(Exception):
    """One event is malformed; the decoder drops it and counts it."""


# ----------------------------------------------------------------------------- decoding


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _hash(value: Any) -> int | bytes:
    if isinstance(value, bytes):
        return value
    if _is_int(value) and _I64_MIN <= value < _U64_LIMIT:
        return value
    raise _Malformed(f"block hash {value!r:.40} is neither a 64-bit integer nor bytes")


def _hashes(value: Any) -> tuple[int | bytes, ...]:
    if not isinstance(value, list):
        raise _Malformed(f"block_hashes is {type(value).__name__}, expected a list")
    # msgpack-python yields ints only within [-2**63, 2**64), so plain ints need no range check.
    if _INT_TYPES.issuperset(map(type, value)):
        return tuple(value)
    return tuple(_hash(v) for v in value)


def _opt_hash(value: Any) -> int | bytes | None:
    return None if value is None else _hash(value)


def _ints(value: Any, name: str) -> tuple[int, ...]:
    # Exact type `int` also refuses bools (msgpack true/false); map(type) runs at C speed.
    if type(value) is not list or not _INT_TYPES.issuperset(map(type, value)):
        raise _Malformed(f"{name} is not a list of integers")
    return tuple(value)


def _int(value: Any, name: str) -> int:
    if not _is_int(value):
        raise _Malformed(f"{name} is {type(value).__name__}, expected an integer")
    return value


def _opt_int(value: Any, name: str) -> int | None:
    return None if value is None else _int(value, name)


def _opt_str(value: Any, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _Malformed(f"{name} is {type(value).__name__}, expected a string or nil")


def _key_part(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_key_part(v) for v in value)
    if value is None or isinstance(value, (str, bytes, int, float)):
        return value
    raise _Malformed(f"extra key part of type {type(value).__name__} is not allowed")


def _extra_keys(value: Any) -> tuple[tuple[Any, ...] | None, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _Malformed(f"extra_keys is {type(value).__name__}, expected a list")
    out: list[tuple[Any, ...] | None] = []
    for entry in value:
        if entry is not None and not isinstance(entry, list):
            raise _Malformed("an extra_keys entry is neither nil nor an array")
        out.append(None if entry is None else _key_part(entry))
    return tuple(out)


def _lookahead(value: Any) -> tuple[tuple[int, ...], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _Malformed("lookahead_token_ids is not a list")
    return tuple(_ints(v, "lookahead_token_ids entry") for v in value)


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "block_hashes": _hashes,
    "parent_block_hash": _opt_hash,
    "token_ids": lambda v: _ints(v, "token_ids"),
    "block_size": lambda v: _int(v, "block_size"),
    "lora_id": lambda v: _opt_int(v, "lora_id"),
    "medium": lambda v: _opt_str(v, "medium"),
    "lora_name": lambda v: _opt_str(v, "lora_name"),
    "extra_keys": _extra_keys,
    "group_idx": lambda v: _opt_int(v, "group_idx"),
    "kv_cache_spec_kind": lambda v: _opt_str(v, "kv_cache_spec_kind"),
    "kv_cache_spec_sliding_window": lambda v: _opt_int(v, "kv_cache_spec_sliding_window"),
    "locality": lambda v: _opt_str(v, "locality"),
    "ownership": lambda v: _opt_str(v, "ownership"),
    "session_id": lambda v: _opt_str(v, "session_id"),
    "lookahead_token_ids": _lookahead,
}

# Fields without which an event means nothing; every other field may be absent (older releases).
_ESSENTIAL = {
    "BlockStored": ("block_hashes", "token_ids", "block_size"),
    "BlockRemoved": ("block_hashes",),
    "AllBlocksCleared": (),
}
# Positional decoding never goes past the widest array layout vLLM published (0.22/0.23).
_ARRAY_FIELDS = {
    "BlockStored": STORED_ARRAY_FIELDS,
    "BlockRemoved": REMOVED_ARRAY_FIELDS,
    "AllBlocksCleared": (),
}
_MAP_FIELDS = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS, "AllBlocksCleared": ()}


class VllmMsgpackCodec:
    """Encode and decode vLLM KV-event payloads (one codec for the vLLM msgpack wire family).

    ``version`` selects the layout :meth:`encode` writes: map-encoded events for 0.24 and later,
    the positional form with that release's fields before. :meth:`decode` accepts every layout
    regardless. ``spec`` is stamped on decoded batches (it names the profile and spec
    fingerprint of the source this codec decodes for); ``stats`` counts what decoding dropped.
    """

    def __init__(self, version: str = DEFAULT_VERSION, *, spec: SpecRef | None = None) -> None:
        self.layout = layout_for(version)
        self._encode = batch_encoder(self.layout)
        self.version = version
        self.spec = spec
        self.stats = DecodeStats()

    def encode(self, batch: EventBatch) -> bytes:
        """Return the msgpack payload vLLM ``version`` would publish for ``batch``."""
        return self._encode(batch)

    def decode(self, payload: bytes) -> EventBatch:
        """Decode one payload; drop (and count) bad events, reject a payload that is no batch."""
        batch = decode_strict(payload, self.spec)
        if batch is None:
            return self._decode_lenient(payload)
        self.stats.batches += 1
        self.stats.events += len(batch.events)
        return batch

    def _decode_lenient(self, payload: bytes) -> EventBatch:
        """Any layout, dropping and counting what is wrong: the decoder that defines the rules
        (``decode_strict`` answers only where this one would keep everything)."""
        try:
            body = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
        except Exception as exc:  # msgpack raises several types; this is its boundary
            raise self._reject(f"not valid msgpack ({type(exc).__name__}: {exc})") from exc
        if isinstance(body, dict):
            # A map-encoded batch (msgspec without array_like): accepted, vLLM 0.33 sends arrays.
            body = [body.get("ts"), body.get("events"), body.get("data_parallel_rank")]
        if not isinstance(body, list) or len(body) < 2:
            raise self._reject(f"top level is {_describe(body)}")
        ts, events = body[0], body[1]
        rank = body[2] if len(body) > 2 else None
        self.stats.ignored_fields += max(0, len(body) - 3)
        if not (isinstance(ts, (int, float)) and not isinstance(ts, bool)):
            raise self._reject(f"ts is {_describe(ts)}, expected a number")
        if not isinstance(events, list):
            raise self._reject(f"events is {_describe(events)}, expected an array")
        if rank is not None and not _is_int(rank):
            raise self._reject(f"data_parallel_rank is {_describe(rank)}, expected int or nil")
        decoded = []
        for raw in events:
            event = self._decode_event(raw)
            if event is not None:
                decoded.append(event)
        self.stats.batches += 1
        self.stats.events += len(decoded)
        return EventBatch(float(ts), tuple(decoded), rank, self.spec)

    def _reject(self, reason: str) -> InvalidArgument:
        self.stats.rejected_payloads += 1
        self.stats.last_problem = reason
        return InvalidArgument(
            f"KV event payload is not a vLLM event batch: {reason}; expected msgpack "
            "[ts, [events...], data_parallel_rank] as vLLM 0.33 publishes it "
            "(vllm/distributed/kv_events.py)",
            field="payload",
        )

    def _decode_event(self, raw: Any) -> KvEvent | None:
        try:
            tag, values = self._fields_of(raw)
            if tag not in _ESSENTIAL:
                self.stats.unknown_types[tag] += 1
                self.stats.last_problem = f"unknown event type {tag!r}"
                return None
            for name in _ESSENTIAL[tag]:
                if name not in values:
                    raise _Malformed(f"{tag} has no {name}")
            kwargs = {name: _CHECKS[name](value) for name, value in values.items()}
        except (_Malformed, RecursionError) as exc:
            self.stats.malformed_events += 1
            self.stats.last_problem = f"malformed event: {exc}"
            return None
        if tag == "BlockStored":
            kwargs.setdefault("parent_block_hash", None)
            return BlockStored(**kwargs)
        if tag == "BlockRemoved":
            return BlockRemoved(**kwargs)
        return AllBlocksCleared()

    def _fields_of(self, raw: Any) -> tuple[str, dict[str, Any]]:
        """Return (tag, known fields present) of a map or tagged-array event."""
        if isinstance(raw, dict):
            tag = raw.get("type")
            if not isinstance(tag, str):
                raise _Malformed("map event has no string 'type'")
            known = _MAP_FIELDS.get(tag)
            if known is None:
                return tag, {}
            values = {k: v for k, v in raw.items() if k in known}
            self.stats.ignored_fields += len(raw) - 1 - len(values)
            return tag, values
        if isinstance(raw, list) and raw and isinstance(raw[0], str):
            tag = raw[0]
            known = _ARRAY_FIELDS.get(tag)
            if known is None:
                return tag, {}
            self.stats.ignored_fields += max(0, len(raw) - 1 - len(known))
            return tag, dict(zip(known, raw[1:], strict=False))
        raise _Malformed(f"event is {_describe(raw)}, expected a tagged map or array")


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return f"an array of {len(value)}"
    return type(value).__name__


def encode(batch: EventBatch, version: str = DEFAULT_VERSION) -> bytes:
    """Encode ``batch`` as vLLM ``version`` publishes it (shortcut for a one-off codec)."""
    return encode_batch(batch, layout_for(version))
