"""Deterministic test vectors for every profile, their files, and checking a spec against them.

:func:`generate_vectors` derives the same cases for any spec, from its own parameters: empty
prompt, under one block, exact multiple, partial tail, a long prompt (2k+ tokens), cache salt,
adapter, multimodal items crossing a block boundary and starting exactly on one, prompt
embeddings, every group whose block spans several hash units, continuation from a parent, and
all extras together; then the cases that settle what a reader of ``docs/cache-keys.md`` could
take two ways (several multimodal items in one block, upper-case hex identifiers, negative
offsets after a parent, prompt-embedding digest counts, group blocks after a parent, a salted
continuation, non-ASCII strings, and every refusal with its error kind). A case the profile does
not support is recorded with the error kind it must raise. :func:`write_vectors` writes one JSON
file per profile into ``testvectors/``; :func:`verify_vectors` runs a spec's vectors through the
local implementation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenkeys.errors import TokenkeysError
from tokenkeys.keys.compute import block_keys
from tokenkeys.keys.context import Adapter, KeyContext, MMItem
from tokenkeys.keys.registry import get_profile, profile_ids
from tokenkeys.keys.spec import CacheKeySpec, Vector

LONG_PROMPT = 2048 + 37
ADAPTER = Adapter("alice-lora", "/adapters/alice-v1")
SALT = "tenant-a"
# One identifier shaped like a vLLM processor hash (64 hex digits), one opaque user uuid.
MM_HEX_ID = hashlib.sha256(b"tokenkeys image 1").hexdigest()
MM_UUID = "user-image-2"
# Non-ASCII text with a character outside the BMP (4 UTF-8 bytes, a surrogate pair in UTF-16).
NON_ASCII_SALT = "tenant-\u00fc-\U0001d518"
NON_ASCII_MODEL = "mod\u00e8le-\U0001d518"


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


def _case(
    spec: CacheKeySpec, name: str, tokens: list[int], ctx: KeyContext | dict[str, Any] | None
) -> Vector:
    # A dict is a context in its JSON form that KeyContext itself refuses (empty strings, ...).
    context = ctx.to_dict() if isinstance(ctx, KeyContext) else ctx
    try:
        if isinstance(ctx, dict):
            ctx = KeyContext.from_dict(ctx)
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
    cases.extend(_precise_cases(spec, base, ctx, three))
    return tuple(_case(spec, name, tokens, c) for name, tokens, c in cases)


def _digest_at(tokens: list[int], spec: CacheKeySpec, ctx: KeyContext | None, i: int) -> bytes:
    """Digest of key ``i`` under ``ctx``, or of the plain key when the profile refuses ``ctx``."""
    try:
        return block_keys(tokens, spec, ctx)[i].digest
    except TokenkeysError:
        plain = KeyContext(model=ctx.model) if ctx is not None and ctx.model else None
        return block_keys(tokens, spec, plain)[i].digest


def _precise_cases(
    spec: CacheKeySpec, base: dict[str, Any], ctx: Any, three: list[int]
) -> list[tuple[str, list[int], KeyContext | dict[str, Any] | None]]:
    """Cases for the rules docs/cache-keys.md states precisely, each settling one question."""
    bs = spec.hash_unit
    embeds = tuple(hashlib.sha256(f"embeds block {i}".encode()).digest() for i in range(4))
    # Three items in one block (block 1 when bs > 1): item order is not Dynamo's sorted order
    # (xxh3 of MM_UUID > the leading 16 hex digits of MM_HEX_ID), and one identifier repeats.
    width = max(1, (bs - 2) // 3)
    at = bs + 1
    order = (MM_UUID, MM_HEX_ID, MM_UUID)
    crowded = tuple(MMItem(ident, at + j * width, width) for j, ident in enumerate(order))
    crossing_tokens = tokens_for(4 * bs, 2)
    crossing = MMItem(MM_HEX_ID, bs // 2, bs + 3)
    cases: list[tuple[str, list[int], KeyContext | dict[str, Any] | None]] = [
        ("mm_sorted_in_block", tokens_for(4 * bs, 6), ctx(mm_items=crowded)),
        ("mm_hex_upper", tokens_for(4 * bs, 2), ctx(mm_items=(MMItem(MM_HEX_ID.upper(), 1, bs),))),
        # The item of mm_crossing_boundary seen from a continuation at block 1: it began before
        # the first given token, so its offset is negative; keys = mm_crossing_boundary[1:].
        (
            "mm_before_parent",
            crossing_tokens[bs:],
            ctx(
                mm_items=(MMItem(MM_HEX_ID, crossing.offset - bs, crossing.length),),
                parent=_digest_at(crossing_tokens, spec, ctx(mm_items=(crossing,)), 0),
            ),
        ),
        (
            "prompt_embeds_partial_tail",
            tokens_for(3 * bs + max(bs // 2, 1) - (1 if bs == 1 else 0)),
            ctx(prompt_embeds_digests=embeds),
        ),
        # Keys of a prompt prefix: digests past the last full block are not used.
        ("prompt_embeds_prefix", three[: 2 * bs], ctx(prompt_embeds_digests=embeds[:3])),
        ("prompt_embeds_too_few", three, ctx(prompt_embeds_digests=embeds[:2])),
        (
            "cache_salt_continuation",
            three[2 * bs :],
            ctx(cache_salt=SALT, parent=_digest_at(three, spec, ctx(cache_salt=SALT), 1)),
        ),
        (
            "non_ascii",
            three,
            ctx(cache_salt=NON_ASCII_SALT, **({"model": NON_ASCII_MODEL} if base else {})),
        ),
        ("adapter_name_only", three, ctx(adapter=Adapter(ADAPTER.name))),
        ("unknown_group", three, ctx(group=len(spec.groups))),
        ("parent_wrong_size", three, ctx(parent=bytes(range(1, 8)))),
        ("token_out_of_range", [*three[: bs - 1], 1 << 32], ctx()),
        ("empty_cache_salt", three, {**base, "cache_salt": ""}),
        ("empty_adapter_name", three, {**base, "adapter": {"name": "", "path": ADAPTER.path}}),
        (
            "empty_mm_identifier",
            three,
            {**base, "mm_items": [{"identifier": "", "offset": 1, "length": 2}]},
        ),
        ("empty_model", three, {"model": ""}),
        (
            "mm_negative_offset_without_parent",
            three,
            {**base, "mm_items": [{"identifier": MM_UUID, "offset": -2, "length": bs + 4}]},
        ),
        (
            "mm_overlapping",
            three,
            {
                **base,
                "mm_items": [
                    {"identifier": MM_UUID, "offset": 1, "length": 3},
                    {"identifier": MM_HEX_ID, "offset": 3, "length": 2},
                ],
            },
        ),
    ]
    for group in spec.groups:
        if group.block_size != bs:
            # A continuation on a group-block boundary: the parent is the group's key 0 (the
            # hash-unit key at its last unit); keys = group_<i>[1:].
            g_tokens = tokens_for(2 * group.block_size + bs // 2, 5)
            parent = block_keys(g_tokens, spec, ctx(group=group.index))[0].digest
            cases.append(
                (
                    f"group_{group.index}_continuation",
                    g_tokens[group.block_size :],
                    ctx(group=group.index, parent=parent),
                )
            )
    if "model" in spec.required_context:
        cases.append(("adapter_without_model", three, KeyContext(adapter=ADAPTER)))
    return cases


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
    # The spec make_spec builds, spelled out here: make_spec sits above this module.
    bare = profile.make_spec(params.pop("block_size"), **params)
    spec = bare.with_vectors(generate_vectors(bare))
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
