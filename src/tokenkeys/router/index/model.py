"""The prefix index: which worker holds which KV block, on which tier, by the key events carry.

:class:`PrefixIndex` is the one interface; ``index.memory`` (bounded, LRU) and ``index.redis``
(shared by router replicas) implement it, and one conformance suite runs against both. Modelled
on llm-d's ``kvblock.Index`` (llm-d-router ``pkg/kvcache/kvblock/index.go``, read at ``ebab687``)
with two deliberate differences:

- One key space. Entries are keyed by the integer the engine's events carry (the spec's
  ``event_encoding``); the router computes the same integers with ``tokenkeys.keys`` for the
  prompt, so no engine-key to request-key mapping is needed.
- :meth:`PrefixIndex.lookup` returns each worker's *consecutive* run from the prompt's first
  block, run-length encoded by tier set, so a lookup stops as soon as no worker continues (llm-d
  returns every key's pods and leaves contiguity to the scorer).

Keys are unsigned 64-bit integers; :func:`index_key` turns any hash an event may carry (vLLM
u64, SGLang's signed int64, raw digest bytes) into one. Tiers are lowercase names ("gpu",
"cpu", ...); :func:`medium_tier` maps an event's ``medium`` to one.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import NoReturn, Protocol, runtime_checkable

from tokenkeys.errors import InvalidArgument
from tokenkeys.keys.spec import BlockKey

U64_MASK = (1 << 64) - 1
#: The tier of an event without ``medium``: vLLM's ``MEDIUM_GPU`` (llm-d's
#: ``defaultEventSourceDeviceTier`` is "gpu" too).
DEFAULT_TIER = "gpu"
#: Tier names: what a lowercased vLLM ``medium`` looks like ("gpu", "cpu", "storage"). Commas
#: and '|' are excluded because the Redis layout joins tiers with them.
TIER_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.:-]{0,31}")
#: Longest worker id accepted (an address, a pod name, "host:port#dp3").
MAX_WORKER_LEN = 256

_INT = frozenset({int})
_STR = frozenset({str})

Segment = tuple[int, tuple[str, ...]]


@dataclass(frozen=True)
class PrefixMatch:
    """One worker's run of consecutive cached blocks, starting at the prompt's first block.

    ``segments`` run-length encode the run in prompt order: ``(count, tiers)`` says the next
    ``count`` blocks are held in every tier of ``tiers`` (sorted, distinct). Adjacent segments
    never have equal tiers, so equal runs compare equal whatever backend produced them.
    """

    worker: str
    segments: tuple[Segment, ...]

    @property
    def blocks(self) -> int:
        """The number of consecutive blocks matched from the start of the prompt."""
        return sum(count for count, _ in self.segments)


@runtime_checkable
class PrefixIndex(Protocol):
    """Where KV blocks are cached, per (worker, tier), keyed by event keys (u64).

    Updates of one worker must be applied in the order its engine emitted them (the ingestion
    layer guarantees it); updates of different workers may interleave freely. ``add`` and
    ``remove`` are idempotent. Backends raise :class:`~tokenkeys.errors.Unavailable` when their
    store cannot be reached, and :class:`~tokenkeys.errors.InvalidArgument` for bad input.
    """

    async def add(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Record that ``worker`` holds the blocks ``keys`` on ``tier``."""
        ...

    async def remove(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Record that ``worker`` no longer holds ``keys`` on ``tier`` (unknown keys: no-op)."""
        ...

    async def clear(self, worker: str) -> None:
        """Forget every block of ``worker`` on every tier."""
        ...

    async def lookup(
        self, keys: Sequence[int], workers: Collection[str] | None = None
    ) -> dict[str, PrefixMatch]:
        """Each worker's consecutive run over ``keys`` (a prompt's block keys, in order).

        Only workers holding ``keys[0]`` appear; ``workers`` restricts the answer to those.
        """
        ...

    async def workers(self) -> frozenset[str]:
        """The workers that hold at least one block."""
        ...

    async def close(self) -> None:
        """Release connections (idempotent)."""
        ...


def index_key(value: int | bytes) -> int:
    """The u64 index key of a hash as an event or a :class:`~tokenkeys.keys.BlockKey` carries it.

    Integers are taken modulo 2**64, so SGLang's signed int64 (``hash_str_to_int64``) and its
    unsigned reading land on one key. Bytes are read as vLLM's
    ``maybe_convert_block_hash`` does (`vllm/distributed/kv_events.py`, 0.33): the last 8 bytes
    big-endian; shorter values are left-padded with zeros as llm-d's ``getHashAsUint64``
    (`engineadapter/common.go`) does.
    """
    if isinstance(value, bool):
        raise InvalidArgument(
            f"block hash must be an integer or bytes, got {value!r}", field="keys"
        )
    if isinstance(value, int):
        return value & U64_MASK
    if isinstance(value, (bytes, bytearray, memoryview)):
        return int.from_bytes(bytes(value)[-8:], "big")
    raise InvalidArgument(
        f"block hash must be an integer or bytes, got {type(value).__name__}", field="keys"
    )


def index_keys(values: Sequence[int | bytes]) -> list[int]:
    """:func:`index_key` of each value; fast when all are already u64 (vLLM's default)."""
    if values and _INT.issuperset(map(type, values)) and min(values) >= 0:
        if max(values) <= U64_MASK:
            return list(values)
    return [index_key(v) for v in values]


def prompt_keys(keys: Iterable[BlockKey]) -> list[int]:
    """The index keys of a prompt's block keys (from ``tokenkeys.keys.block_keys``), in order."""
    return [index_key(k.event_key) for k in keys]


def medium_tier(medium: str | None) -> str:
    """The tier of an event's ``medium``: lowercased, ``None`` meaning "gpu" (vLLM, llm-d)."""
    if medium is None:
        return DEFAULT_TIER
    tier = _MEDIUM_TIERS.get(medium) if type(medium) is str else None
    if tier is None:
        tier = check_tier(medium.lower())
        if type(medium) is str and len(_MEDIUM_TIERS) < _MEDIA_KEPT:
            _MEDIUM_TIERS[medium] = tier
    return tier


# The tiers of the str media seen: a pure function of the string, asked once per ingested
# event, and engines send a few ("GPU", "CPU"), so the pattern is matched once per medium.
# Bounded: media beyond the first _MEDIA_KEPT are mapped on every call.
_MEDIA_KEPT = 64
_MEDIUM_TIERS: dict[str, str] = {}


def check_worker(worker: str) -> str:
    """Return ``worker`` if it is a usable worker id, else raise :class:`InvalidArgument`."""
    if not isinstance(worker, str) or not worker or len(worker) > MAX_WORKER_LEN:
        raise InvalidArgument(
            f"worker must be a non-empty string of at most {MAX_WORKER_LEN} characters, "
            f"got {worker!r:.80}",
            field="worker",
        )
    return worker


def check_tier(tier: str) -> str:
    """Return ``tier`` if it is a valid tier name, else raise :class:`InvalidArgument`."""
    if not isinstance(tier, str) or TIER_PATTERN.fullmatch(tier) is None:
        raise InvalidArgument(
            f"tier {tier!r:.40} is not a tier name; expected lowercase letters, digits and "
            "'_.:-' (at most 32), such as 'gpu' or 'cpu'",
            field="tier",
        )
    return tier


def check_keys(keys: Sequence[int]) -> Sequence[int]:
    """Return ``keys`` if every one is an int in [0, 2**64), else raise :class:`InvalidArgument`.

    Convert event hashes with :func:`index_key` first.
    """
    check_key_types(keys)
    check_key_range(keys)
    return keys


def check_key_types(keys: Sequence[int]) -> Sequence[int]:
    """The first half of :func:`check_keys`: ``keys`` is a sequence of ints (range unchecked).

    ``type()`` is exact: bools and numpy scalars are refused (they would serialize differently).
    """
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise InvalidArgument(
            f"keys must be a sequence of integers, got {type(keys).__name__}", field="keys"
        )
    if keys and not _INT.issuperset(map(type, keys)):
        _refuse_key(keys, 0)
    return keys


def check_key_range(keys: Sequence[int], start: int = 0) -> None:
    """The second half of :func:`check_keys`: ``keys[start:]``, ints, are in [0, 2**64).

    A caller that found ``keys[:start]`` in a table of checked keys passes ``start`` (an int
    equal to a table key is in range). ``array("Q")`` converts in one C loop and raises
    ``OverflowError`` for a negative or too large int; only then are the keys searched in
    Python for the first bad one.
    """
    if start >= len(keys):
        return
    try:
        array("Q", islice(keys, start, None) if start else keys)
    except OverflowError:
        _refuse_key(keys, start)


def _refuse_key(keys: Sequence[int], start: int) -> NoReturn:
    at = next(
        i
        for i in range(start, len(keys))
        if type(keys[i]) is not int or not 0 <= keys[i] <= U64_MASK
    )
    raise InvalidArgument(
        f"keys[{at}] must be an integer in [0, 2**64), got {keys[at]!r:.40}; convert event "
        "hashes with tokenkeys.router.index_key()",
        field="keys",
    )


def check_filter(workers: Collection[str] | None) -> frozenset[str] | None:
    """Validate a lookup's worker filter; ``None`` means every worker."""
    if workers is None:
        return None
    if isinstance(workers, str):
        raise InvalidArgument(
            f"workers must be a collection of worker ids, got the string {workers!r:.80}",
            field="workers",
        )
    # Every id a non-empty str of at most MAX_WORKER_LEN, checked in C (a router passes its
    # whole fleet, 1,000 ids and more, on every lookup); check_worker names the first bad one.
    try:
        allowed = workers if type(workers) is frozenset else frozenset(workers)
        fine = not allowed or (
            _STR.issuperset(map(type, allowed))
            and "" not in allowed
            and max(map(len, allowed)) <= MAX_WORKER_LEN
        )
    except TypeError:  # an unhashable id: not a str, which check_worker says
        fine = False
    if not fine:
        allowed = frozenset(check_worker(w) for w in workers)
    return allowed
