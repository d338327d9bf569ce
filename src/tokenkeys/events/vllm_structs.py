"""vLLM's KV-event structs declared with msgspec, the library vLLM publishes them with.

vLLM 0.33 (`vllm/distributed/kv_events.py`) declares ``EventBatch(msgspec.Struct,
array_like=True, omit_defaults=True, gc=False)`` and its events as ``KVCacheEvent`` subclasses
(``array_like`` up to 0.23, maps tagged ``"type"`` since 0.24, ``omit_defaults=True``, tagged by
class name) and encodes them with ``msgspec.msgpack.Encoder()``. Two uses here:

- :func:`encode_batch` copies our events into structs of exactly that shape per release (field
  order, which fields have no default, field count), so the bytes are vLLM's by construction:
  msgspec sizes a map header by the declared fields (0.33's 16-entry BlockStored gets map16),
  omits None defaults, writes every element of an array-like struct, picks the shortest integer
  heads, float64 floats and bin for bytes.
- :func:`decode_strict` decodes, in C, the payloads a well-formed vLLM publisher sends: every
  event of one form, only known fields, all types right. It returns ``None`` for anything else
  (unknown keys or event types, extra elements, a bad field, nested extra keys, invalid
  msgpack), and the lenient decoder in ``vllm_codec`` decides, drops and counts; so whenever
  this path answers, the lenient one would have answered the same with nothing dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from operator import attrgetter
from typing import Any

import msgspec

from tokenkeys.errors import InvalidArgument
from tokenkeys.events.model import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    SpecRef,
    batch_from_fields,
)
from tokenkeys.events.vllm_layout import (
    REMOVED_ARRAY_FIELDS,
    REMOVED_FIELDS,
    REMOVED_REQUIRED,
    STORED_ARRAY_FIELDS,
    STORED_FIELDS,
    STORED_REQUIRED,
    WireLayout,
)

_ENCODER = msgspec.msgpack.Encoder()
_asdict = msgspec.structs.asdict
_Batch = msgspec.defstruct(
    "EventBatch",
    [("ts", float), ("events", list), ("data_parallel_rank", int | None, None)],
    array_like=True,
    omit_defaults=True,
    gc=False,
)

# ----------------------------------------------------------------------------- encoding


def _declare(name: str, names: tuple[str, ...], required: tuple[str, ...], array: bool) -> type:
    # Field types do not matter for encoding (msgspec writes what each value is).
    spec = [(n, Any) if n in required else (n, Any, None) for n in names]
    return msgspec.defstruct(name, spec, tag=name, array_like=array, omit_defaults=True, gc=False)


def _encoders(layout: WireLayout) -> dict[type, tuple[type, attrgetter | None]]:
    """Per event class: vLLM's struct for ``layout`` and a getter of its field values."""
    array = layout.form == "array"
    stored = _declare("BlockStored", layout.stored_fields, STORED_REQUIRED, array)
    removed = _declare("BlockRemoved", layout.removed_fields, REMOVED_REQUIRED, array)
    cleared = _declare("AllBlocksCleared", (), (), array)
    return {
        BlockStored: (stored, attrgetter(*layout.stored_fields)),
        BlockRemoved: (removed, attrgetter(*layout.removed_fields)),
        AllBlocksCleared: (cleared, None),
    }


@cache
def batch_encoder(layout: WireLayout) -> Callable[[EventBatch], bytes]:
    """The encoder of ``layout``: batch -> the msgpack payload vLLM publishes (``batch.spec`` is
    not written). Built once per layout, so a codec does not look its structs up per batch."""
    encoders = _encoders(layout)

    def struct_of(event: KvEvent) -> Any:
        found = encoders.get(type(event))
        if found is None:
            found = next((v for c, v in encoders.items() if isinstance(event, c)), None)
            if found is None:
                raise InvalidArgument(
                    f"cannot encode {type(event).__name__} as a vLLM KV event; allowed: "
                    "BlockStored, BlockRemoved, AllBlocksCleared",
                    field="events",
                )
        struct, values = found
        # Every layout has at least two fields per data event, so the getter gives a tuple.
        return struct() if values is None else struct(*values(event))

    def encode(batch: EventBatch) -> bytes:
        events = [struct_of(event) for event in batch.events]
        try:
            body = _Batch(float(batch.ts), events, batch.data_parallel_rank)
            return _ENCODER.encode(body)
        except (OverflowError, TypeError, ValueError) as exc:
            raise InvalidArgument(
                f"event batch has a value msgpack cannot encode ({exc}); hashes must be ints "
                "in [-2**63, 2**64) or bytes, token ids ints, extra keys tuples of "
                "str/int/bytes/None",
                field="events",
            ) from exc

    return encode


def encode_batch(batch: EventBatch, layout: WireLayout) -> bytes:
    """Encode a batch as the msgpack payload vLLM publishes (``batch.spec`` is not written)."""
    return batch_encoder(layout)(batch)


# ----------------------------------------------------------------------------- strict decoding

_Hash = int | bytes
_STORED_TYPES: dict[str, Any] = {
    "block_hashes": tuple[_Hash, ...],
    "parent_block_hash": _Hash | None,
    "token_ids": tuple[int, ...],
    "block_size": int,
    "lora_id": int | None,
    "medium": str | None,
    "lora_name": str | None,
    # Parts may be str and bytes, which one msgspec union cannot hold: checked after decoding.
    "extra_keys": tuple[tuple[Any, ...] | None, ...] | None,
    "group_idx": int | None,
    "kv_cache_spec_kind": str | None,
    "kv_cache_spec_sliding_window": int | None,
    "locality": str | None,
    "ownership": str | None,
    "session_id": str | None,
    "lookahead_token_ids": tuple[tuple[int, ...], ...] | None,
}
_REMOVED_TYPES: dict[str, Any] = {
    "block_hashes": tuple[_Hash, ...],
    "medium": str | None,
    "group_idx": int | None,
    "locality": str | None,
    "ownership": str | None,
}
# What the lenient decoder requires of each form; every other field may be absent (None).
_MAP_REQUIRED = {"BlockStored": ("block_hashes", "token_ids", "block_size")}
_ARRAY_REQUIRED = {"BlockStored": STORED_FIELDS[:4]}
_KEY_SCALARS = frozenset({str, bytes, int, float, bool, type(None)})


def _strict(name: str, types: dict[str, Any], names, required, array: bool) -> type:
    spec = [(n, types[n]) if n in required else (n, types[n], None) for n in names]
    # kw_only lets a required field follow an optional one (map form: order is free).
    return msgspec.defstruct(
        name,
        spec,
        tag=name,
        array_like=array,
        kw_only=not array,
        forbid_unknown_fields=True,
        gc=False,
    )


def _batch_decoder(array: bool, model_of: dict[type, type]) -> msgspec.msgpack.Decoder:
    required = _ARRAY_REQUIRED if array else _MAP_REQUIRED
    stored = _strict(
        "BlockStored",
        _STORED_TYPES,
        STORED_ARRAY_FIELDS if array else STORED_FIELDS,
        required["BlockStored"],
        array,
    )
    removed = _strict(
        "BlockRemoved",
        _REMOVED_TYPES,
        REMOVED_ARRAY_FIELDS if array else REMOVED_FIELDS,
        ("block_hashes",),
        array,
    )
    cleared = _strict("AllBlocksCleared", {}, (), (), array)
    model_of.update({stored: BlockStored, removed: BlockRemoved, cleared: AllBlocksCleared})
    batch = msgspec.defstruct(
        "EventBatch",
        [
            ("ts", float),
            ("events", list[stored | removed | cleared]),
            ("data_parallel_rank", int | None, None),
        ],
        array_like=True,
        forbid_unknown_fields=True,
        gc=False,
    )
    return msgspec.msgpack.Decoder(batch)


# Strict struct class -> our event class.
_MODEL_OF: dict[type, type] = {}
_DECODERS = (_batch_decoder(False, _MODEL_OF), _batch_decoder(True, _MODEL_OF))


def _flat_extra_keys(extra: tuple[tuple[Any, ...] | None, ...] | None) -> bool:
    """Whether extra keys hold only scalars (nested arrays and maps go the lenient way)."""
    if extra is None or extra.count(None) == len(extra):  # vLLM's usual: one None per block
        return True
    return all(e is None or _KEY_SCALARS.issuperset(map(type, e)) for e in extra)


def decode_strict(payload: bytes, spec: SpecRef | None) -> EventBatch | None:
    """The batch of a payload in vLLM's exact form (all map or all array events), else None."""
    for decoder in _DECODERS:
        try:
            body = decoder.decode(payload)
            break
        except msgspec.ValidationError:
            continue
        except msgspec.DecodeError:
            return None
    else:
        return None
    events = []
    for event in body.events:
        cls = _MODEL_OF[type(event)]
        values = _asdict(event)
        if cls is BlockStored and not _flat_extra_keys(values["extra_keys"]):
            return None
        events.append((cls, values))
    return batch_from_fields(body.ts, events, body.data_parallel_rank, spec)
