"""Frozen values that describe a deployment's cache keys: :class:`CacheKeySpec` and friends.

A spec pins one profile (an engine family's algorithm at an engine version) for one deployment:
the hash unit, the KV-cache groups, the actual root bytes and how they were derived, how keys
appear in KV events, the extra-key rules, and the test vectors a client must reproduce before it
computes keys itself. Its ``fingerprint`` is SHA-256 over the canonical JSON of every field except
the fingerprint itself and the vectors; the vectors enter through ``vectors_digest`` (SHA-256 of
their canonical JSON), so a spec can be served with or without its vectors and keep one identity.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Any, NamedTuple, overload

from tokenkeys.errors import InvalidArgument


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no whitespace, UTF-8, no NaN."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


class BlockKey(NamedTuple):
    """One full block's key: the full digest bytes and the integer the engine's events carry.

    Immutable (a named tuple: cheap to build, which matters at one key per block).
    """

    digest: bytes
    event_key: int

    @property
    def hex(self) -> str:
        """The digest as lowercase hex."""
        return self.digest.hex()


def make_block_keys(digests: list[bytes], event_keys: list[int]) -> list[BlockKey]:
    """Block keys from parallel lists of digests and event keys.

    ``tuple.__new__(BlockKey, pair)`` is exactly what the named tuple's constructor does, minus
    its Python frame; mapped at C level it costs a tenth of a per-key comprehension, which
    matters at one key per block.
    """
    return list(map(tuple.__new__, repeat(BlockKey), zip(digests, event_keys, strict=True)))


class KeyArray(Sequence[BlockKey]):
    """A prompt's block keys as two flat buffers: no Python object per block.

    ``digests`` holds every key's digest, ``size`` bytes each; ``events`` every event key as a
    native 64-bit word (signed where the profile's events are, SGLang's). Read as a sequence it
    is the list :func:`~tokenkeys.keys.block_keys` returns (equal to it, item by item); a
    router reads :attr:`index_keys` instead, the u64 words the prefix index takes as they are.
    :func:`~tokenkeys.keys.compute.block_key_array` makes one.
    """

    __slots__ = ("digests", "events", "size", "signed")

    def __init__(self, digests: bytes, events: bytes, size: int, *, signed: bool = False) -> None:
        if len(events) % 8 or len(digests) != len(events) // 8 * size:
            raise ValueError("a KeyArray needs one 8-byte event key and one digest per block")
        self.digests = digests
        self.events = events
        self.size = size
        self.signed = signed

    @classmethod
    def of(cls, keys: Sequence[BlockKey], size: int, *, signed: bool = False) -> KeyArray:
        """The array of ``keys`` (each digest ``size`` bytes)."""
        events = array("q" if signed else "Q", [k.event_key for k in keys])
        return cls(b"".join(k.digest for k in keys), events.tobytes(), size, signed=signed)

    def __len__(self) -> int:
        return len(self.events) // 8

    @property
    def event_keys(self) -> list[int]:
        """The event keys as the engine's events carry them."""
        return array("q" if self.signed else "Q", self.events).tolist()

    @property
    def index_keys(self) -> array:
        """The prefix index's keys (u64: a signed event key modulo 2**64), as ``array('Q')``."""
        return array("Q", self.events)

    def tolist(self) -> list[BlockKey]:
        """The keys as :class:`BlockKey` objects."""
        size, d = self.size, self.digests
        digests = [d[i : i + size] for i in range(0, len(d), size)] if size else []
        return make_block_keys(digests, self.event_keys)

    @overload
    def __getitem__(self, i: int) -> BlockKey: ...
    @overload
    def __getitem__(self, i: slice) -> KeyArray: ...
    def __getitem__(self, i: int | slice) -> BlockKey | KeyArray:
        n, size = len(self), self.size
        if isinstance(i, slice):
            picked = range(n)[i]
            if picked.step == 1:
                lo, hi = picked.start, picked.stop if picked else picked.start
                return KeyArray(
                    self.digests[lo * size : hi * size],
                    self.events[lo * 8 : hi * 8],
                    size,
                    signed=self.signed,
                )
            return KeyArray(
                b"".join(self.digests[j * size : j * size + size] for j in picked),
                b"".join(self.events[j * 8 : j * 8 + 8] for j in picked),
                size,
                signed=self.signed,
            )
        j = range(n)[i]  # IndexError as a list raises it
        word = array("q" if self.signed else "Q", self.events[j * 8 : j * 8 + 8])[0]
        return BlockKey(self.digests[j * size : j * size + size], word)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyArray):
            return (
                self.digests == other.digests
                and self.event_keys == other.event_keys
                and (self.size == other.size or not len(self))
            )
        if isinstance(other, (list, tuple)):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        return f"KeyArray({len(self)} keys of {self.size} bytes)"


#: Group kinds whose blocks tokenkeys describes (vLLM ``KVCacheSpecKind`` values, 0.32
#: ``vllm/v1/kv_cache_interface.py``): full attention keeps every block of a prefix, a sliding
#: window only the blocks its window reaches.
FULL_ATTENTION = "full_attention"
SLIDING_WINDOW = "sliding_window"


@dataclass(frozen=True)
class KeyGroup:
    """One KV-cache group: its kind, block size and how its keys derive from hash units.

    ``derivation`` is ``"last_hash_unit"``: a group block of ``k`` hash units is keyed by the
    chained hash at its last hash unit (vLLM >= 0.24 ``BlockHashListWithBlockSize``). Every
    group of a hybrid model keys its blocks with the same chain; what differs is which blocks
    a group keeps: ``sliding_window`` (tokens, for kind ``"sliding_window"`` only) bounds what
    a sliding-window group's layers attend to, and so which of its blocks a later request can
    reuse (``tokenkeys.router.index.hybrid``).
    """

    index: int
    block_size: int
    kind: str = FULL_ATTENTION
    derivation: str = "last_hash_unit"
    sliding_window: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``sliding_window`` only when set, so older specs keep their fingerprint)."""
        out: dict[str, Any] = {
            "index": self.index,
            "block_size": self.block_size,
            "kind": self.kind,
            "derivation": self.derivation,
        }
        if self.sliding_window is not None:
            out["sliding_window"] = self.sliding_window
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KeyGroup:
        """Inverse of :meth:`to_dict`."""
        window = data.get("sliding_window")
        return cls(
            index=int(data["index"]),
            block_size=int(data["block_size"]),
            kind=str(data.get("kind", FULL_ATTENTION)),
            derivation=str(data.get("derivation", "last_hash_unit")),
            sliding_window=None if window is None else int(window),
        )


@dataclass(frozen=True)
class Vector:
    """One test vector: inputs and either the expected keys or the expected error kind."""

    name: str
    tokens: tuple[int, ...]
    context: Mapping[str, Any] | None = None
    keys: tuple[str, ...] | None = None
    event_keys: tuple[int, ...] | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form; exactly one of keys/event_keys or error is present."""
        out: dict[str, Any] = {"name": self.name, "tokens": list(self.tokens)}
        if self.context:
            out["context"] = dict(self.context)
        if self.error is not None:
            out["error"] = self.error
        else:
            out["keys"] = list(self.keys or ())
            out["event_keys"] = list(self.event_keys or ())
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Vector:
        """Inverse of :meth:`to_dict`."""
        return cls(
            name=str(data["name"]),
            tokens=tuple(int(t) for t in data["tokens"]),
            context=data.get("context") or None,
            keys=tuple(data["keys"]) if "keys" in data else None,
            event_keys=tuple(int(k) for k in data["event_keys"]) if "event_keys" in data else None,
            error=data.get("error"),
        )


def vectors_digest(vectors: tuple[Vector, ...]) -> str:
    """SHA-256 hex over the canonical JSON list of the vectors."""
    return hashlib.sha256(canonical_json([v.to_dict() for v in vectors])).hexdigest()


@dataclass(frozen=True)
class CacheKeySpec:
    """A deployment's cache-key contract; build one with :func:`tokenkeys.keys.make_spec`.

    ``root_hex`` holds the actual parent bytes of the first block where the profile has one
    (empty when the root is per request, e.g. llm-d mixes the model name into it, or when the
    profile has no root). ``root_derivation`` says how they were obtained: ``"default_seed"``,
    ``"seed:<s>"``, ``"explicit"`` or ``"none"``.
    """

    profile_id: str
    engine: str
    algorithm: str
    engine_version: str
    hash_unit: int
    groups: tuple[KeyGroup, ...]
    root_hex: str
    root_derivation: str
    serialization: str
    digest: str
    event_encoding: str
    extra_keys: str
    partial_block: str
    client_computable: bool
    required_context: tuple[str, ...] = ()
    vectors: tuple[Vector, ...] = field(default=(), compare=False, repr=False)
    vectors_digest: str = ""
    fingerprint: str = ""

    @property
    def root(self) -> bytes:
        """The root bytes (empty when the profile has no fixed root)."""
        return bytes.fromhex(self.root_hex)

    def _identity(self) -> dict[str, Any]:
        data = self.to_dict(include_vectors=False)
        data.pop("fingerprint", None)
        return data

    def with_vectors(self, vectors: tuple[Vector, ...]) -> CacheKeySpec:
        """A copy carrying ``vectors``, with their digest and the fingerprint recomputed."""
        spec = replace(self, vectors=tuple(vectors), vectors_digest=vectors_digest(vectors))
        return spec.sealed()

    def without_vectors(self) -> CacheKeySpec:
        """A copy without the vector bodies (digest and fingerprint unchanged)."""
        return replace(self, vectors=())

    def sealed(self) -> CacheKeySpec:
        """A copy whose ``fingerprint`` is recomputed from its other fields."""
        fp = hashlib.sha256(canonical_json(self._identity())).hexdigest()
        return replace(self, fingerprint=fp)

    def group(self, index: int) -> KeyGroup:
        """The group with ``index``; :class:`InvalidArgument` when there is none."""
        for g in self.groups:
            if g.index == index:
                return g
        raise InvalidArgument(
            f"group {index} is not in this spec; groups: {[g.index for g in self.groups]}",
            field="group",
        )

    def to_dict(self, *, include_vectors: bool = True) -> dict[str, Any]:
        """JSON form."""
        out: dict[str, Any] = {
            "profile_id": self.profile_id,
            "engine": self.engine,
            "algorithm": self.algorithm,
            "engine_version": self.engine_version,
            "hash_unit": self.hash_unit,
            "groups": [g.to_dict() for g in self.groups],
            "root_hex": self.root_hex,
            "root_derivation": self.root_derivation,
            "serialization": self.serialization,
            "digest": self.digest,
            "event_encoding": self.event_encoding,
            "extra_keys": self.extra_keys,
            "partial_block": self.partial_block,
            "client_computable": self.client_computable,
            "required_context": list(self.required_context),
            "vectors_digest": self.vectors_digest,
            "fingerprint": self.fingerprint,
        }
        if include_vectors:
            out["vectors"] = [v.to_dict() for v in self.vectors]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheKeySpec:
        """Inverse of :meth:`to_dict`; missing fields raise :class:`InvalidArgument`."""
        try:
            return cls(
                profile_id=str(data["profile_id"]),
                engine=str(data["engine"]),
                algorithm=str(data["algorithm"]),
                engine_version=str(data["engine_version"]),
                hash_unit=int(data["hash_unit"]),
                groups=tuple(KeyGroup.from_dict(g) for g in data.get("groups", ())),
                root_hex=str(data.get("root_hex", "")),
                root_derivation=str(data.get("root_derivation", "none")),
                serialization=str(data["serialization"]),
                digest=str(data["digest"]),
                event_encoding=str(data["event_encoding"]),
                extra_keys=str(data["extra_keys"]),
                partial_block=str(data["partial_block"]),
                client_computable=bool(data["client_computable"]),
                required_context=tuple(data.get("required_context", ())),
                vectors=tuple(Vector.from_dict(v) for v in data.get("vectors", ())),
                vectors_digest=str(data.get("vectors_digest", "")),
                fingerprint=str(data.get("fingerprint", "")),
            )
        except KeyError as exc:
            raise InvalidArgument(
                f"cache-key spec is missing field {exc.args[0]!r}", field="spec"
            ) from None
