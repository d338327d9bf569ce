"""The registry of cache-key profiles, built lazily from one constructor table.

Like tiktoken's ``registry.py``: each engine-family module contributes a table of profile id to
constructor; a profile is built on first use and cached. An unknown id raises
:class:`~tokenkeys.errors.NotFound` naming every known id.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, lru_cache

from tokenkeys.errors import NotFound
from tokenkeys.keys import dynamo, llmd, sglang, vllm
from tokenkeys.keys.profile import Profile, ProfileInfo


@lru_cache(maxsize=1)
def _constructors() -> dict[str, Callable[[], Profile]]:
    table: dict[str, Callable[[], Profile]] = {}
    for module in (vllm, sglang, dynamo, llmd):
        table.update(module.profiles())
    return table


@cache
def get_profile(profile_id: str) -> Profile:
    """The profile named ``profile_id`` (e.g. ``"vllm/sha256_cbor@0.31"``)."""
    constructor = _constructors().get(profile_id)
    if constructor is None:
        raise NotFound(
            f"unknown cache-key profile {profile_id!r}; known profiles: {', '.join(profile_ids())}",
            field="profile_id",
        )
    return constructor()


def profile_ids() -> list[str]:
    """Every known profile id, sorted."""
    return sorted(_constructors())


def list_profiles() -> list[ProfileInfo]:
    """One info entry (id, client_computable, parameters, ...) per known profile, by id."""
    return [get_profile(pid).info() for pid in profile_ids()]
