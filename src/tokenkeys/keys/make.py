""":func:`make_spec`, the one way to a sealed spec: above both the keys and their test vectors.

The vectors are computed with :func:`~tokenkeys.keys.compute.block_keys`, and a spec carries its
vectors, so the function that builds a spec with vectors sits above both modules rather than in
either (the data flows one way: profile -> spec -> keys -> vectors -> sealed spec).
"""

from __future__ import annotations

from tokenkeys.keys.registry import get_profile
from tokenkeys.keys.spec import CacheKeySpec
from tokenkeys.keys.vectors import generate_vectors


def make_spec(
    profile_id: str,
    block_size: int | None,
    *,
    root_seed: str | None = None,
    root_hex: str | None = None,
    groups: object = None,
    vectors: bool = True,
) -> CacheKeySpec:
    """A sealed deployment spec for ``profile_id``.

    ``block_size`` is the hash unit. With ``groups`` (block sizes, dicts or ``KeyGroup`` values;
    vLLM profiles only) it is the configured ``prefix_match_unit``, or ``None`` for the gcd of
    the group block sizes. ``root_seed`` is the engine's seed string (vLLM: ``PYTHONHASHSEED``;
    llm-d: ``hashSeed``), ``root_hex`` explicit root bytes an engine published. With
    ``vectors`` the spec carries test vectors computed for exactly these parameters.
    """
    profile = get_profile(profile_id)
    spec = profile.make_spec(block_size, root_seed=root_seed, root_hex=root_hex, groups=groups)
    if not vectors:
        return spec.sealed()
    return spec.with_vectors(generate_vectors(spec))
