"""The OpenEngine protobuf codec: :class:`EventBatch` <-> ``openengine.v1.KvEventBatch``.

Field mapping (OpenEngine v1 ``kv.proto`` @4def7c5 against vLLM 0.33's event fields):

- Hashes become ``KvBlockHash{value, encoding}``: an integer hash is its 8-byte big-endian
  two's-complement form with ``encoding`` ``"uint64"`` (vLLM, Dynamo: the event key as an
  unsigned 64-bit integer) or ``"int64"`` (SGLang: signed), chosen by the stream's cache-key
  spec; a raw digest (vLLM with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``) is ``"bytes"``.
- ``parent_block_hash`` None leaves the field unset; ``lora_id`` None is 0 (vLLM ids start at
  1); ``lora_name`` and ``kv_cache_spec_kind`` None are ""; ``group_idx`` None is 0.
- ``medium``: "GPU" -> ``STORAGE_MEDIUM_GPU``, "CPU" -> ``CPU_PINNED``, "STORAGE" -> ``DISK``.
- ``extra_keys``: one ``OpaqueKeyTuple`` per hash, empty for None; each element of the key
  tuple is one JSON text in ``values`` (a string ``"\\"sql-lora\\""``, an mm pair
  ``"[\\"img-A\\",5]"``); bytes (prompt-embeds digests) as a JSON string of their hex.
- ``ts`` (float seconds) becomes ``timestamp_unix_nanos``.

Fields OpenEngine has no place for (locality, ownership, session_id, lookahead_token_ids) are
dropped; the decoder maps the defaults above back to None, so a stream of the simulated engine
decodes into the same events through either transport (tests prove it).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from tokenkeys._gen.openengine.v1 import cache_keys_pb2, kv_pb2
from tokenkeys.errors import InvalidArgument
from tokenkeys.events.model import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeStats,
    EventBatch,
    ExternalBlockHash,
    KvEvent,
)

IntEncoding = Literal["uint64", "int64"]

_MEDIUM_TO_PROTO = {
    "GPU": kv_pb2.STORAGE_MEDIUM_GPU,
    "CPU": kv_pb2.STORAGE_MEDIUM_CPU_PINNED,
    "STORAGE": kv_pb2.STORAGE_MEDIUM_DISK,
}
_MEDIUM_FROM_PROTO = {v: k for k, v in _MEDIUM_TO_PROTO.items()}


def int_encoding_of(event_encoding: str) -> IntEncoding:
    """The KvBlockHash encoding for a spec's ``event_encoding`` (``i64...`` is signed)."""
    return "int64" if event_encoding.startswith("i64") else "uint64"


def encode_hash(value: ExternalBlockHash, encoding: IntEncoding) -> kv_pb2.KvBlockHash:
    """One hash as ``KvBlockHash``."""
    if isinstance(value, bytes):
        return kv_pb2.KvBlockHash(value=value, encoding="bytes")
    signed = value < 0
    if signed and encoding != "int64":
        raise InvalidArgument(f"negative hash {value} in a uint64 stream", field="block_hashes")
    raw = value.to_bytes(8, "big", signed=encoding == "int64")
    return kv_pb2.KvBlockHash(value=raw, encoding=encoding)


def decode_hash(message: kv_pb2.KvBlockHash) -> ExternalBlockHash:
    """The hash a ``KvBlockHash`` carries; an unknown encoding is refused, never guessed."""
    if message.encoding in ("uint64", "int64"):
        if len(message.value) != 8:
            raise InvalidArgument(
                f"{message.encoding} block hash has {len(message.value)} bytes, expected 8",
                field="block_hashes",
            )
        return int.from_bytes(message.value, "big", signed=message.encoding == "int64")
    if message.encoding == "bytes":
        return bytes(message.value)
    raise InvalidArgument(
        f"block hash encoding {message.encoding!r} is not one this codec reads "
        "(uint64, int64, bytes)",
        field="block_hashes",
    )


def _json_part(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple | list):
        return [_json_part(v) for v in value]
    return value


def _tuple_part(value: Any) -> Any:
    return tuple(_tuple_part(v) for v in value) if isinstance(value, list) else value


def _encode_extra(entry: tuple[Any, ...] | None) -> kv_pb2.OpaqueKeyTuple:
    if entry is None:
        return kv_pb2.OpaqueKeyTuple()
    return kv_pb2.OpaqueKeyTuple(
        values=[json.dumps(_json_part(v), separators=(",", ":")) for v in entry]
    )


def _decode_extra(message: kv_pb2.OpaqueKeyTuple) -> tuple[Any, ...] | None:
    if not message.values:
        return None
    try:
        return tuple(_tuple_part(json.loads(v)) for v in message.values)
    except ValueError:
        raise InvalidArgument(
            "extra_keys values must be JSON texts (tokenkeys' OpaqueKeyTuple convention)",
            field="extra_keys",
        ) from None


class ProtobufEventCodec:
    """Encode and decode OpenEngine ``KvEventBatch`` messages (one codec per wire family).

    ``int_encoding`` names how integer hashes are labelled (see the module doc); ``key_spec``
    is stamped on every encoded batch (tokenkeys' field 100).
    """

    def __init__(
        self,
        int_encoding: IntEncoding = "uint64",
        key_spec: cache_keys_pb2.CacheKeySpecRef | None = None,
    ) -> None:
        #: What :meth:`decode` saw and dropped.
        self.stats = DecodeStats()
        self.int_encoding = int_encoding
        self.key_spec = key_spec

    def encode(self, seq: int, batch: EventBatch) -> kv_pb2.KvEventBatch:
        """The protobuf form of batch number ``seq``."""
        out = kv_pb2.KvEventBatch(
            sequence_number=seq,
            timestamp_unix_nanos=max(0, round(batch.ts * 1e9)),
            data_parallel_rank=batch.data_parallel_rank or 0,
        )
        if self.key_spec is not None:
            out.key_spec.CopyFrom(self.key_spec)
        for event in batch.events:
            self._encode_event(event, out.events.add())
        return out

    def _encode_event(self, event: KvEvent, out: kv_pb2.KvEvent) -> None:
        enc = self.int_encoding
        if isinstance(event, BlockStored):
            msg = out.block_stored
            msg.block_hashes.extend(encode_hash(h, enc) for h in event.block_hashes)
            if event.parent_block_hash is not None:
                msg.parent_block_hash.CopyFrom(encode_hash(event.parent_block_hash, enc))
            msg.token_ids.extend(event.token_ids)
            msg.block_size = event.block_size
            msg.lora_id = event.lora_id or 0
            msg.lora_name = event.lora_name or ""
            msg.medium = _MEDIUM_TO_PROTO.get(event.medium or "", kv_pb2.STORAGE_MEDIUM_UNSPECIFIED)
            if event.extra_keys is not None:
                msg.extra_keys.extend(_encode_extra(e) for e in event.extra_keys)
            msg.group_idx = event.group_idx or 0
            msg.kv_cache_spec_kind = event.kv_cache_spec_kind or ""
            msg.kv_cache_spec_sliding_window = event.kv_cache_spec_sliding_window or 0
        elif isinstance(event, BlockRemoved):
            msg_r = out.block_removed
            msg_r.block_hashes.extend(encode_hash(h, enc) for h in event.block_hashes)
            msg_r.medium = _MEDIUM_TO_PROTO.get(
                event.medium or "", kv_pb2.STORAGE_MEDIUM_UNSPECIFIED
            )
            msg_r.group_idx = event.group_idx or 0
        else:
            out.all_blocks_cleared.SetInParent()

    def decode(self, message: kv_pb2.KvEventBatch) -> tuple[int, EventBatch]:
        """(sequence number, batch) of a ``KvEventBatch``.

        Events of an unknown kind (a newer sender's oneof member) and malformed events (a hash
        of an unknown encoding or length, extra keys that are not JSON) are dropped and counted
        in :attr:`stats`, as the vLLM codec does, so one bad event does not cost the batch.
        """
        stats = self.stats
        stats.batches += 1
        events: list[KvEvent] = []
        for raw in message.events:
            stats.events += 1
            kind = raw.WhichOneof("event")
            if kind is None:
                stats.unknown_types["<unknown or unset>"] += 1
                stats.last_problem = "event of an unknown kind (or none) dropped"
                continue
            try:
                events.append(self._decode_event(kind, raw))
            except InvalidArgument as error:
                stats.malformed_events += 1
                stats.last_problem = f"malformed {kind} event dropped: {error.message}"
        batch = EventBatch(
            message.timestamp_unix_nanos / 1e9, tuple(events), message.data_parallel_rank
        )
        return message.sequence_number, batch

    def _decode_event(self, kind: str, raw: kv_pb2.KvEvent) -> KvEvent:
        if kind == "block_stored":
            m = raw.block_stored
            extra = tuple(_decode_extra(e) for e in m.extra_keys) if m.extra_keys else None
            return BlockStored(
                block_hashes=tuple(decode_hash(h) for h in m.block_hashes),
                parent_block_hash=(
                    decode_hash(m.parent_block_hash) if m.HasField("parent_block_hash") else None
                ),
                token_ids=tuple(m.token_ids),
                block_size=m.block_size,
                lora_id=m.lora_id or None,
                medium=_MEDIUM_FROM_PROTO.get(m.medium),
                lora_name=m.lora_name or None,
                extra_keys=extra,
                group_idx=m.group_idx,
                kv_cache_spec_kind=m.kv_cache_spec_kind or None,
                kv_cache_spec_sliding_window=m.kv_cache_spec_sliding_window or None,
            )
        if kind == "block_removed":
            r = raw.block_removed
            return BlockRemoved(
                block_hashes=tuple(decode_hash(h) for h in r.block_hashes),
                medium=_MEDIUM_FROM_PROTO.get(r.medium),
                group_idx=r.group_idx,
            )
        return AllBlocksCleared()
