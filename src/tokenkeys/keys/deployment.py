"""A deployment's cache-key spec from its options: the one place command lines become a spec.

``tokenkeys serve`` (one spec per served model), ``tokenkeys keys`` and the simulated engine all
build their spec with :func:`build_spec`, so a server, its engine and a command-line check can
never describe the same deployment differently. Every bad option is a :class:`ConfigError` that
names the option, raised before anything is served.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import gcd
from typing import Any

from tokenkeys.errors import ConfigError, TokenkeysError
from tokenkeys.keys.make import make_spec
from tokenkeys.keys.registry import profile_ids
from tokenkeys.keys.spec import CacheKeySpec

# The built-in simulated engine hashes its blocks with this profile, so the default spec is
# exact for a server that is its own engine. In front of a real engine, name the engine's.
DEFAULT_PROFILE = "vllm/sha256_cbor@0.31"
# vLLM's default KV block size (CacheConfig.block_size on CUDA), which is also its hash unit.
DEFAULT_BLOCK_SIZE = 16
# A value of the profile option that serves no spec at all.
NO_PROFILE = "none"

_KIND = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class KeySpecOptions:
    """The cache-key options of one deployment, as a command line gives them.

    ``profile`` ``None`` or ``"none"`` means no spec. ``block_size`` ``None`` means the default
    (16), or with ``kv_groups`` the gcd of the group block sizes (vLLM ``hash_block_size``).
    ``kv_groups`` is ``"kind[@window]:block_size,..."``, e.g.
    ``"sliding_window@64:32,full_attention:32"`` (a sliding-window group names its window).
    """

    profile: str | None = DEFAULT_PROFILE
    block_size: int | None = None
    root_seed: str | None = None
    root_hex: str | None = None
    kv_groups: str | None = None


def parse_kv_groups(text: str) -> list[dict[str, Any]]:
    """``"kind[@window]:block_size,..."`` as group dicts in order; a bare number is full
    attention."""
    groups: list[dict[str, Any]] = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        kind, sep, size = part.rpartition(":")
        if not sep:
            kind = "full_attention"
        kind, at, window = kind.partition("@")
        if (
            not _KIND.fullmatch(kind)
            or not size.isdigit()
            or int(size) == 0
            or (at and (not window.isdigit() or int(window) == 0))
        ):
            raise ConfigError(
                f"kv-groups entry {i} is {part!r}; each entry is KIND[@WINDOW]:BLOCK_SIZE with "
                "KIND a lowercase name such as full_attention or sliding_window, WINDOW the "
                "sliding window in tokens and BLOCK_SIZE a positive integer, e.g. "
                "sliding_window@64:32,full_attention:32",
                field="kv_groups",
            )
        group: dict[str, Any] = {"kind": kind, "block_size": int(size)}
        if at:
            group["sliding_window"] = int(window)
        groups.append(group)
    return groups


def build_spec(options: KeySpecOptions, *, vectors: bool = True) -> CacheKeySpec | None:
    """The sealed spec the options describe, or ``None`` for the ``none`` profile."""
    if options.profile is None or options.profile == NO_PROFILE:
        return None
    if options.profile not in profile_ids():
        raise ConfigError(
            f"unknown cache-key profile {options.profile!r}; known profiles: "
            f"{', '.join(profile_ids())} (or {NO_PROFILE!r} to serve no spec); "
            "see tokenkeys keys --list",
            field="profile",
        )
    if options.root_seed is not None and options.root_hex is not None:
        raise ConfigError(
            "give the root as a seed or as hex bytes, not both (--root-seed or --root-hex)",
            field="root_seed",
        )
    groups = parse_kv_groups(options.kv_groups) if options.kv_groups else None
    block_size = options.block_size
    if block_size is None:
        # vLLM resolve_kv_cache_block_sizes: without prefix_match_unit the hash unit is the gcd
        # of the group block sizes.
        block_size = gcd(*(g["block_size"] for g in groups)) if groups else DEFAULT_BLOCK_SIZE
    try:
        return make_spec(
            options.profile,
            block_size,
            root_seed=options.root_seed,
            root_hex=options.root_hex,
            groups=groups,
            vectors=vectors,
        )
    except TokenkeysError as exc:
        option = _OPTIONS.get(exc.field or "", "")
        raise ConfigError(
            f"cache-key spec for {options.profile}: {exc.message}"
            + (f" (option {option})" if option else ""),
            field=exc.field,
        ) from None


# Core field names -> the command-line options that set them.
_OPTIONS = {
    "block_size": "--block-size",
    "root_seed": "--root-seed / --root-hex",
    "root_hex": "--root-seed / --root-hex",
    "groups": "--kv-groups",
}
