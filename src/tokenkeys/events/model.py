"""KV-cache events as frozen values, independent of any wire format or transport.

The three event kinds and their field names follow vLLM 0.33 (`vllm/distributed/kv_events.py`,
classes ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``, ``KVEventBatch``) so that a
vLLM stream decodes into them without renaming. Fields are listed in vLLM's declaration order,
which is also the order of the positional (array) wire form used up to vLLM 0.23.

What vLLM's wire format cannot carry travels out of band: :class:`SpecRef` names the cache-key
profile and spec fingerprint that a batch's hashes follow. It rides on :class:`EventBatch` in
memory and in the OpenEngine ``SubscribeKvEvents`` stream, and on :class:`EventSourceInfo` for
discovery; the vLLM msgpack payload and ZMQ frames stay byte-compatible with vLLM (a fourth frame
or an extra payload field would break llm-d's and Dynamo's subscribers, which accept exactly three
frames and a three-element batch).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

#: A block hash as events carry it: vLLM's ``ExternalBlockHash`` (``bytes | int``). With vLLM's
#: default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`` it is the last 8 digest bytes read as an
#: unsigned big-endian integer (0 <= h < 2**64); otherwise the raw digest bytes.
ExternalBlockHash = int | bytes

#: vLLM's ``MEDIUM_GPU``; offloading connectors use "CPU" and "STORAGE".
MEDIUM_GPU = "GPU"


def _freeze(value: Any) -> Any:
    """Return ``value`` with every list turned into a tuple, recursively (hashable, immutable)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class SpecRef:
    """Names the cache-key profile and the spec fingerprint that event hashes follow.

    A router indexes hashes only from sources whose ``spec_fingerprint`` it has verified (it
    reproduced the spec's test vectors, or it asks the engine to compute keys).
    """

    profile_id: str
    spec_fingerprint: str


@dataclass(frozen=True)
class BlockStored:
    """Full blocks entered the prefix cache (vLLM ``BlockStored``, fields in 0.33 order).

    ``block_hashes`` are chained: the first block's parent is ``parent_block_hash`` (None when the
    first block starts at token 0), each later block's parent is the previous hash. ``token_ids``
    spans all stored blocks. ``extra_keys`` has one entry per hash (None or a tuple).
    """

    block_hashes: tuple[ExternalBlockHash, ...]
    parent_block_hash: ExternalBlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        _set(self, "block_hashes", tuple(self.block_hashes))
        _set(self, "token_ids", tuple(self.token_ids))
        if self.extra_keys is not None:
            _set(self, "extra_keys", _freeze(self.extra_keys))
        if self.lookahead_token_ids is not None:
            _set(self, "lookahead_token_ids", _freeze(self.lookahead_token_ids))


def hashed_offset(event: BlockStored) -> int | None:
    """The position, in the event's span of ``token_ids``, of the block its first hash keys.

    vLLM 0.32 (``BlockPool.cache_full_blocks``, ``vllm/v1/core/block_pool.py``) publishes the
    tokens of every newly full block of a request from ``parent_block_hash`` on, but hashes only
    of the blocks it keeps: a sliding-window group has already freed (nulled) the blocks its
    window no longer reaches, which are the span's head, so the hashes key the span's last
    ``len(block_hashes)`` blocks. For full attention the offset is 0. ``None`` when the event is
    not of that shape (a partial block of tokens, more hashes than blocks).
    """
    size = event.block_size
    if size <= 0 or len(event.token_ids) % size:
        return None
    offset = len(event.token_ids) // size - len(event.block_hashes)
    return offset if offset >= 0 else None


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks left the prefix cache (vLLM ``BlockRemoved``; vLLM sends one hash per event)."""

    block_hashes: tuple[ExternalBlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None

    def __post_init__(self) -> None:
        _set(self, "block_hashes", tuple(self.block_hashes))


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was reset (vLLM ``AllBlocksCleared``, no fields)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared

#: Event classes by the tag vLLM writes (the class name).
EVENT_TYPES: dict[str, type[BlockStored] | type[BlockRemoved] | type[AllBlocksCleared]] = {
    "BlockStored": BlockStored,
    "BlockRemoved": BlockRemoved,
    "AllBlocksCleared": AllBlocksCleared,
}


@dataclass(frozen=True)
class EventBatch:
    """The events of one engine step (vLLM ``KVEventBatch``) plus out-of-band provenance.

    ``ts``, ``events`` and ``data_parallel_rank`` are vLLM's three batch fields. ``spec`` is ours:
    it is never written into the vLLM payload; a decoder fills it from the source it subscribed
    to (see :class:`EventSourceInfo`).
    """

    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int | None = None
    spec: SpecRef | None = None

    def __post_init__(self) -> None:
        _set(self, "events", tuple(self.events))


@dataclass(frozen=True)
class EventSourceInfo:
    """Where and how a worker publishes KV events; what discovery advertises.

    ``endpoint`` and ``replay_endpoint`` are routable addresses (never a wildcard such as
    ``tcp://*:5557`` or ``tcp://0.0.0.0:5557``). ``wire_format`` names the payload codec and
    ``wire_version`` the vLLM release whose layout it follows.
    """

    endpoint: str
    topic: str
    spec: SpecRef
    replay_endpoint: str | None = None
    data_parallel_rank: int = 0
    medium: str = MEDIUM_GPU
    wire_format: str = "vllm-msgpack"
    wire_version: str = "0.33"


# Per class: its number of fields and the defaults of those that have one.
_DEFAULTS: dict[type, tuple[int, dict[str, Any]]] = {
    cls: (
        len(fields(cls)),
        {f.name: f.default for f in fields(cls) if f.default is not MISSING},
    )
    for cls in (BlockStored, BlockRemoved, AllBlocksCleared)
}


def batch_from_fields(
    ts: float,
    events: Iterable[tuple[type[KvEvent], dict[str, Any]]],
    data_parallel_rank: int | None,
    spec: SpecRef | None,
) -> EventBatch:
    """Build a batch from each event's class and field values, without running the dataclass
    ``__init__``s; omitted fields take their defaults.

    For decoders whose schema already guarantees what ``__post_init__`` would establish (tuples,
    not lists, all the way down): a frozen dataclass ``__init__`` sets each field through
    ``object.__setattr__``, which made building a 15-field ``BlockStored`` cost more than
    decoding its bytes. Each ``values`` dict becomes that event's ``__dict__``: the caller must
    not use it afterwards.
    """
    new, bind = object.__new__, object.__setattr__
    built = []
    for cls, values in events:
        count, defaults = _DEFAULTS[cls]
        if len(values) < count:
            values = {**defaults, **values}
        event = new(cls)
        bind(event, "__dict__", values)
        built.append(event)
    batch = new(EventBatch)
    rank = data_parallel_rank
    bind(
        batch,
        "__dict__",
        {"ts": ts, "events": tuple(built), "data_parallel_rank": rank, "spec": spec},
    )
    return batch


@dataclass
class DecodeStats:
    """What a decoder saw and what it dropped, for metrics and diagnostics."""

    batches: int = 0
    events: int = 0
    malformed_events: int = 0
    unknown_types: Counter[str] = field(default_factory=Counter)
    ignored_fields: int = 0
    rejected_payloads: int = 0
    last_problem: str | None = None

    @property
    def dropped_events(self) -> int:
        """Events left out of decoded batches (malformed or of an unknown type)."""
        return self.malformed_events + sum(self.unknown_types.values())
