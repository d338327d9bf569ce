"""Deterministic test vectors for every profile, their files, and checking a spec against them.

:func:`generate_vectors` derives the same cases for any spec, from its own parameters: empty
prompt, under one block, exact multiple, partial tail, a long prompt (2k+ tokens), cache salt,
adapter, multimodal items crossing a block boundary and starting exactly on one, prompt
embeddings, every group whose block spans several hash units, continuation from a parent, and
all extras together. A case the profile does not support is recorded with the error kind it
must raise. :func:`write_vectors` writes one JSON file per profile into ``testvectors/``;
:func:`verify_vectors` runs a spec's vectors through the local implementation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenkeys.errors import TokenkeysError
from tokenkeys.keys.compute import block_keys, make_spec
from tokenkeys.keys.context import Adapter, KeyContext, MMItem
from tokenkeys.keys.registry import get_profile, profile_ids
from tokenkeys.keys.spec import CacheKeySpec, Vector

LONG_PROMPT = 2048 + 37
ADAPTER = Adapter("alice-lora", "/adapters/alice-v1")
SALT = "tenant-a"
# One identifier shaped like a vLLM processor hash (64 hex digits), one opaque user uuid.
MM_HEX_ID = hashlib.sha256(b"tokenkeys image 1").hexdigest()
MM_UUID = "user-image-2"


def file_spec_params(profile_id: str) -> dict[str, Any]:
    """Parameters of the spec used for ``testvectors/<profile>.json``."""
    profile = get_profile(profile_id)
    params: dict[str, Any] = {"block_size": 16}
    if profile.engine == "vllm":
        params = {"block_size": None, "groups": [16, 32, 64]}
        if not getattr(profile, "crypto", True):
            params["root_seed"] = "0"
    return params


def tokens_for(n: int, stream: int = 0) -> list[int]:
    """``n`` deterministic token ids covering every CBOR integer width (1, 2, 3 and 5 bytes)."""
    out = []
    for i in range(n):
        x = (i * 2654435761 + stream * 40503 + 12345) % 4294967291
        width = (i + stream) % 4
        if width == 0:
            out.append(x % 24)
        elif width == 1:
            out.append(x % 256)
        elif width == 2:
            out.append(x % 65536)
        else:
            out.append(65536 + x % 200000)
    return out


def _case(spec: CacheKeySpec, name: str, tokens: list[int], ctx: KeyContext | None) -> Vector:
    context = ctx.to_dict() if ctx is not None else None
    try:
        keys = block_keys(tokens, spec, ctx)
    except TokenkeysError as exc:
        return Vector(name, tuple(tokens), context, error=type(exc).__name__)
    return Vector(
        name,
        tuple(tokens),
        context,
        keys=tuple(k.hex for k in keys),
        event_keys=tuple(k.event_key for k in keys),
    )


def generate_vectors(spec: CacheKeySpec) -> tuple[Vector, ...]:
    """The deterministic cases for ``spec`` (keys computed with this implementation)."""
    bs = spec.hash_unit
    base: dict[str, Any] = {}
    if "model" in spec.required_context:
        base["model"] = "test-model"

    def ctx(**fields: Any) -> KeyContext | None:
        merged = {**base, **fields}
        return KeyContext(**merged) if merged else None

    three = tokens_for(3 * bs)
    cases: list[tuple[str, list[int], KeyContext | None]] = [
        ("empty_prompt", [], ctx()),
        ("under_one_block", tokens_for(bs - 1), ctx()),
        ("exact_multiple", three, ctx()),
        ("partial_tail", tokens_for(3 * bs + max(bs // 2, 1) - (1 if bs == 1 else 0)), ctx()),
        ("long_prompt", tokens_for(LONG_PROMPT, 1), ctx()),
        ("cache_salt", three, ctx(cache_salt=SALT)),
        ("adapter", three, ctx(adapter=ADAPTER)),
        (
            "mm_crossing_boundary",
            tokens_for(4 * bs, 2),
            ctx(mm_items=(MMItem(MM_HEX_ID, bs // 2, bs + 3),)),
        ),
        (
            "mm_on_boundary",
            tokens_for(4 * bs, 3),
            ctx(mm_items=(MMItem(MM_UUID, bs, bs), MMItem(MM_HEX_ID, 3 * bs, 1))),
        ),
        (
            "prompt_embeds",
            three,
            ctx(
                prompt_embeds_digests=tuple(
                    hashlib.sha256(f"embeds block {i}".encode()).digest() for i in range(3)
                )
            ),
        ),
        (
            "all_extras",
            tokens_for(3 * bs, 4),
            ctx(adapter=ADAPTER, cache_salt=SALT, mm_items=(MMItem(MM_UUID, 1, bs),)),
        ),
    ]
    for group in spec.groups:
        if group.block_size != bs:
            n = 2 * group.block_size + bs // 2
            cases.append((f"group_{group.index}", tokens_for(n, 5), ctx(group=group.index)))
    # Continuation: the last block of `three`, chained from the key of its second block.
    try:
        second = block_keys(three, spec, ctx())[1].digest
    except TokenkeysError:
        second = None
    if second is not None:
        cases.append(("continuation", three[2 * bs :], ctx(parent=second)))
    if "model" in spec.required_context:
        cases.append(("missing_model", three, None))
    return tuple(_case(spec, name, tokens, c) for name, tokens, c in cases)


@dataclass(frozen=True)
class VectorReport:
    """Outcome of running a spec's vectors: ``passed`` and, if not, the first mismatch."""

    profile_id: str
    total: int
    passed: bool
    first_failure: str | None = None


def verify_vectors(spec: CacheKeySpec) -> VectorReport:
    """Run every vector of ``spec`` through :func:`block_keys`; stop at the first mismatch."""
    if not spec.vectors:
        return VectorReport(spec.profile_id, 0, False, "the spec carries no vectors")
    for i, vector in enumerate(spec.vectors):
        problem = _check(spec, vector)
        if problem is not None:
            return VectorReport(
                spec.profile_id, len(spec.vectors), False, f"vector {i} {vector.name}: {problem}"
            )
    return VectorReport(spec.profile_id, len(spec.vectors), True)


def _check(spec: CacheKeySpec, vector: Vector) -> str | None:
    try:
        ctx = KeyContext.from_dict(vector.context) if vector.context else None
        keys = block_keys(vector.tokens, spec, ctx)
    except TokenkeysError as exc:
        got = type(exc).__name__
        if vector.error is None:
            return f"raised {got}: {exc.message}"
        return None if got == vector.error else f"expected error {vector.error}, got {got}"
    except Exception as exc:  # a vector from elsewhere must never crash the caller
        return f"raised {type(exc).__name__}: {exc}"
    if vector.error is not None:
        return f"expected error {vector.error}, got {len(keys)} keys"
    got_hex = tuple(k.hex for k in keys)
    if got_hex != tuple(vector.keys or ()):
        for j, (a, b) in enumerate(zip(got_hex, vector.keys or (), strict=False)):
            if a != b:
                return f"key {j} is {a}, expected {b}"
        return f"{len(got_hex)} keys, expected {len(vector.keys or ())}"
    if tuple(k.event_key for k in keys) != tuple(vector.event_keys or ()):
        return "event keys differ"
    return None


def file_name(profile_id: str) -> str:
    """Filename-safe name of a profile's vector file: ``/`` -> ``__``, ``@`` -> ``--``."""
    return profile_id.replace("/", "__").replace("@", "--") + ".json"


def vector_file(profile_id: str) -> dict[str, Any]:
    """The JSON document written for one profile."""
    profile = get_profile(profile_id)
    params = file_spec_params(profile_id)
    spec = make_spec(profile_id, params.pop("block_size"), **params)
    doc: dict[str, Any] = {
        "profile": profile.info().to_dict(),
        "spec": spec.to_dict(include_vectors=False),
        "vectors": [v.to_dict() for v in spec.vectors],
    }
    if profile.engine == "vllm":
        # Roots for a few seeds: root = hash_fn(seed string) through the same serializer.
        doc["roots"] = [
            {"seed": seed, "root_hex": profile.hash_object(seed).hex()}
            for seed in ("vllm-none-hash", "0", "42")
        ]
    return doc


def write_vectors(directory: str | Path) -> list[Path]:
    """Write one vector file per profile into ``directory``; returns the paths written."""
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for profile_id in profile_ids():
        path = out_dir / file_name(profile_id)
        text = json.dumps(vector_file(profile_id), indent=1, sort_keys=True) + "\n"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
