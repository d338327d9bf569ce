"""KV-event batches as smg's ``smg.grpc.common.KvEventBatch``, by the rules vLLM's relay applies.

vLLM 0.32's ``--grpc`` server streams its events through smg-grpc-servicer 0.14.1's relay
(``smg_grpc_servicer/kv_relay.py``, ``Normalizer``), which mirrors the Rust relay smg ships
(``crates/engine_servicer/src/kv_wire.rs``). This converter applies the same rules to
tokenkeys' events, so smg's index sees what it would see in front of vLLM itself:

- a block hash is folded to a signed 64-bit identity: an integer's low 64 bits, a raw digest's
  last 8 bytes big-endian (the integer vLLM would have published);
- events are dropped for a residency agent's ownership (``kvcr``), a non-local locality, an
  unknown medium, a cache group that is not main attention (a group's kind is learned from its
  stores; a kind-less event of an unknown group counts as main), no hashes or tokens, blocks
  that do not tile the tokens, or a hash repeated within its own chain;
- a store names its namespace: ``lora_name`` and ``cache_salt`` (the salt is the first text
  extra key of block 0 that is not the LoRA name), each inherited from the parent block's store
  when the event does not carry it; a hash is remembered while any of its physical copies
  (at most 8 counted) is stored;
- ``tier`` and ``locality`` are always set, ``cache_level`` for blocks off the device, the
  per-block ``extra_keys`` typed (text, number, blob, multimodal identifier and offset);
- event ids count every input event from 1, forwarded or not; the batch keeps the stream's
  sequence number, timestamp and data-parallel rank.

One converter per subscription: the namespace and group records are that stream's.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from tokenkeys.events.model import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    ExternalBlockHash,
    KvEvent,
)
from tokenkeys.server.grpc.vllm_engine.stubs import common_pb2

_U64 = (1 << 64) - 1
_SIGN = 1 << 63
MAIN_ATTENTION_KINDS = ("full_attention", "mla_attention", "sink_full_attention")
COPIES_CAP = 8
_RESIDENCY_AGENT = "kvcr"

_TIERS = {
    **dict.fromkeys(("GPU", "DEVICE"), common_pb2.KV_CACHE_TIER_DEVICE),
    **dict.fromkeys(("CPU", "CPU_PINNED", "CPU_TIER1"), common_pb2.KV_CACHE_TIER_HOST),
    **dict.fromkeys(("CPU_TIER2", "DISK", "NVME", "STORAGE"), common_pb2.KV_CACHE_TIER_DISK),
    **dict.fromkeys(("EXTERNAL", "NETWORK", "REMOTE", "SHARED"), common_pb2.KV_CACHE_TIER_EXTERNAL),
}
_CACHE_LEVEL = {
    common_pb2.KV_CACHE_TIER_HOST: 1,
    common_pb2.KV_CACHE_TIER_DISK: 2,
    common_pb2.KV_CACHE_TIER_EXTERNAL: 3,
}

Namespace = tuple[str | None, str | None]


def fold_hash(value: ExternalBlockHash) -> int:
    """A block hash as smg's signed 64-bit ``block_hash``."""
    masked = int.from_bytes(bytes(value)[-8:], "big") if isinstance(value, bytes) else value & _U64
    return masked - (1 << 64) if masked >= _SIGN else masked


def _extra_key(value: Any) -> common_pb2.KvBlockExtraKey | None:
    """One untagged extra key, typed; None for a shape smg's proto does not model."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return common_pb2.KvBlockExtraKey(text=value)
    if isinstance(value, int):
        return common_pb2.KvBlockExtraKey(number=value) if -_SIGN <= value < _SIGN else None
    if isinstance(value, bytes):
        return common_pb2.KvBlockExtraKey(blob=value)
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    ):
        return common_pb2.KvBlockExtraKey(
            multimodal=common_pb2.KvMultimodalKey(identifier=value[0], offset=value[1])
        )
    return None


def _salt(extra_keys: tuple | None, lora_name: str | None) -> str | None:
    """vLLM's cache salt: block 0's first text extra key that is not the LoRA name."""
    if not extra_keys or not extra_keys[0]:
        return None
    for key in extra_keys[0]:
        if isinstance(key, str) and key and key != lora_name:
            return key
    return None


class SmgEventConverter:
    """Converts one subscription's batches; see the module doc for the rules."""

    def __init__(self) -> None:
        # hash -> (namespace, copies) per tier; group index -> is main attention
        self._blocks: dict[int, dict[int, tuple[Namespace, int]]] = {}
        self._groups: dict[int, bool] = {}
        self._event_id = 0

    def convert(self, seq: int, batch: EventBatch) -> common_pb2.KvEventBatch:
        """The proto batch of ``batch`` under sequence number ``seq``."""
        out = common_pb2.KvEventBatch(sequence_number=seq, timestamp=batch.ts)
        if batch.data_parallel_rank is not None:
            out.dp_rank = batch.data_parallel_rank
        for event in batch.events:
            self._event_id += 1
            converted = self._event(event)
            if converted is not None:
                converted.event_id = self._event_id
                out.events.append(converted)
        return out

    def _event(self, event: KvEvent) -> common_pb2.KvCacheEvent | None:
        if isinstance(event, AllBlocksCleared):
            self._blocks.clear()
            self._groups.clear()
            return common_pb2.KvCacheEvent(cleared=common_pb2.KvCacheCleared())
        if isinstance(event, BlockStored):
            stored = self._stored(event)
            return None if stored is None else common_pb2.KvCacheEvent(stored=stored)
        if isinstance(event, BlockRemoved):
            removed = self._removed(event)
            return None if removed is None else common_pb2.KvCacheEvent(removed=removed)
        return None

    def _tier(self, event: BlockStored | BlockRemoved, learn: bool) -> int | None:
        """The event's tier, or None when the relay's gates drop it."""
        if event.ownership is not None and event.ownership.lower() == _RESIDENCY_AGENT:
            return None
        if event.locality is not None and event.locality.upper() != "LOCAL":
            return None
        tier = (
            common_pb2.KV_CACHE_TIER_DEVICE
            if event.medium is None
            else _TIERS.get(event.medium.upper())
        )
        if tier is None or event.group_idx is None:
            return tier
        kind = getattr(event, "kv_cache_spec_kind", None)
        if kind is not None:
            main = kind in MAIN_ATTENTION_KINDS
            if learn:
                self._groups[event.group_idx] = main
        else:
            main = self._groups.get(event.group_idx, True)
        return tier if main else None

    def _stored(self, event: BlockStored) -> common_pb2.KvBlocksStored | None:
        tier = self._tier(event, learn=True)
        if tier is None or not event.block_hashes or not event.token_ids:
            return None
        width = event.block_size
        hashes = [fold_hash(h) for h in event.block_hashes]
        if width <= 0 or width >= 2**31 or len(hashes) * width != len(event.token_ids):
            return None
        parent = None if event.parent_block_hash is None else fold_hash(event.parent_block_hash)
        chain = hashes if parent is None else [parent, *hashes]
        if len(set(chain)) != len(chain):
            return None
        records = self._blocks.setdefault(tier, {})
        lora_name = event.lora_name or None
        salt = _salt(event.extra_keys, lora_name)
        if parent is not None and parent in records and (lora_name is None or salt is None):
            inherited = records[parent][0]
            lora_name = inherited[0] if lora_name is None else lora_name
            salt = inherited[1] if salt is None else salt
        for block_hash in hashes:
            copies = records[block_hash][1] if block_hash in records else 0
            records[block_hash] = ((lora_name, salt), min(copies + 1, COPIES_CAP))
        level = _CACHE_LEVEL.get(tier)
        extra = event.extra_keys or ()
        blocks = []
        for index, block_hash in enumerate(hashes):
            block = common_pb2.KvBlock(
                block_hash=block_hash,
                token_ids=event.token_ids[index * width : (index + 1) * width],
                block_size=width,
            )
            if event.lora_id is not None:
                block.lora_id = event.lora_id
            if level is not None:
                block.cache_level = level
            keys = extra[index] if index < len(extra) else None
            for key in keys or ():
                typed = _extra_key(key)
                if typed is not None:
                    block.extra_keys.append(typed)
            blocks.append(block)
        stored = common_pb2.KvBlocksStored(
            blocks=blocks, tier=tier, locality=common_pb2.KV_CACHE_LOCALITY_LOCAL
        )
        _set_present(
            stored,
            parent_block_hash=parent,
            medium=event.medium,
            group_idx=event.group_idx,
            kv_cache_spec_kind=event.kv_cache_spec_kind,
            kv_cache_spec_sliding_window=event.kv_cache_spec_sliding_window,
            ownership=event.ownership,
            session_id=event.session_id,
            lora_name=lora_name,
            cache_salt=salt,
        )
        return stored

    def _removed(self, event: BlockRemoved) -> common_pb2.KvBlocksRemoved | None:
        tier = self._tier(event, learn=False)
        if tier is None:
            return None
        hashes = [fold_hash(h) for h in event.block_hashes]
        records = self._blocks.get(tier, {})
        for block_hash in hashes:
            record = records.get(block_hash)
            if record is not None and record[1] <= 1:
                del records[block_hash]
            elif record is not None:
                records[block_hash] = (record[0], record[1] - 1)
        removed = common_pb2.KvBlocksRemoved(
            block_hashes=hashes, tier=tier, locality=common_pb2.KV_CACHE_LOCALITY_LOCAL
        )
        level = _CACHE_LEVEL.get(tier)
        if level is not None:
            removed.cache_level = level
        _set_present(
            removed, medium=event.medium, group_idx=event.group_idx, ownership=event.ownership
        )
        return removed


def _set_present(message: Message, **fields: object) -> None:
    """Set the optional ``fields`` of ``message`` that the event carries (None: absent, so the
    proto field stays unset, as the relay leaves a field vLLM did not send)."""
    for name, value in fields.items():
        if value is not None:
            setattr(message, name, value)
