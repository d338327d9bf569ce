"""Block-key computation: the fast path of every profile against an engine-style reference.

For 10k and 128k tokens per profile, five timings in the same run:

* **C array**: :func:`tokenkeys.keys.block_key_array` through the compiled key core
  (``tokenkeys.keys._chains``: serialization and digest in one pass, the keys written into two
  flat buffers, no Python object per block), what a router needs per prompt;
* **C**: :func:`tokenkeys.keys.block_keys` through the compiled key core: the same pass, one
  ``BlockKey`` (a tuple, a bytes, an int) per block;
* **python**: the same call on the pure-Python fast path (``native.CORE`` off: token encodings
  computed once per call, one digest call per block), what a platform without a compiler runs;
* **reference**: the straightforward per-block algorithm as the engine writes it (build the
  block's object, ``cbor2.dumps(..., canonical=True)`` / ``pickle.dumps`` / per-token
  ``hashlib`` updates, hash, chain), checked byte-identical to the fast path;
* **floor**: only the digest calls over the exact bytes each block hashes (payloads prepared
  beforehand), the cost no implementation can go below.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import struct
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import cbor2  # noqa: E402
import xxhash  # noqa: E402
from timing import fastest  # noqa: E402

from tokenkeys.keys import (  # noqa: E402
    KeyContext,
    block_key_array,
    block_keys,
    get_profile,
    make_spec,
    native,
)
from tokenkeys.keys.compute import reference_block_keys  # noqa: E402
from tokenkeys.keys.llmd import fnv1a64  # noqa: E402
from tokenkeys.keys.registry import profile_ids  # noqa: E402

BLOCK = 16


def _floor(profile_id: str, tokens: list[int], keys: list, spec) -> Callable[[], object]:
    """Digest calls only, over the bytes each block hashes (prepared outside the timing)."""
    profile = get_profile(profile_id)
    blocks = [tokens[i : i + BLOCK] for i in range(0, len(tokens) - BLOCK + 1, BLOCK)]
    parents = [spec.root] + [k.digest for k in keys[:-1]]
    if profile.engine == "vllm":
        if profile.algorithm.endswith("_cbor"):
            payloads = [
                cbor2.dumps((p, tuple(b), None), canonical=True)
                for p, b in zip(parents, blocks, strict=True)
            ]
        else:
            payloads = [
                pickle.dumps((p, tuple(b), None), protocol=5)
                for p, b in zip(parents, blocks, strict=True)
            ]
        if profile.algorithm.startswith("sha256"):
            return lambda: [hashlib.sha256(x).digest() for x in payloads]
        return lambda: [xxhash.xxh3_128_digest(x) for x in payloads]
    if profile.engine == "sglang":
        payloads = [
            (p if i else b"") + struct.pack(f"<{BLOCK}I", *b)
            for i, (p, b) in enumerate(zip(parents, blocks, strict=True))
        ]
        return lambda: [hashlib.sha256(x).digest() for x in payloads]
    if profile.engine == "dynamo":
        payloads = [struct.pack(f"<{BLOCK}I", *b) for b in blocks]
        pairs = [bytes(16)] * max(len(blocks) - 1, 0)
        h = xxhash.xxh3_64_intdigest
        return lambda: ([h(x, 1337) for x in payloads], [h(x, 1337) for x in pairs])
    if profile.algorithm == "xxh64":
        payloads = [bytes(8) + struct.pack(f"<{BLOCK}I", *b) for b in blocks]
        return lambda: [xxhash.xxh64_intdigest(x, 0) for x in payloads]
    payloads = [
        cbor2.dumps([k.event_key, b, None], canonical=True)
        for k, b in zip(keys, blocks, strict=True)
    ]
    return lambda: [fnv1a64(x) for x in payloads]


def _python(call: Callable[[], object]) -> Callable[[], object]:
    """``call`` with the compiled core switched off (the pure-Python fast paths)."""

    def run() -> object:
        core, native.CORE = native.CORE, None
        try:
            return call()
        finally:
            native.CORE = core

    return run


#: Issue 37's aims for the compiled core: C array / floor at most this, per group of profiles.
AIMS = {
    "vllm/sha256_cbor": (("vllm/sha256_cbor@",), 1.5),
    "the xxhash profiles": (("vllm/xxhash_cbor@", "dynamo/xxh3@", "llmd/xxh64@"), 2.0),
}


def _aims(ratios: dict[str, list[float]]) -> str:
    """One sentence: each aim, the range of C array / floor its profiles reached in this run."""
    parts = []
    for name, (prefixes, aim) in AIMS.items():
        got = [r for p, rs in ratios.items() if p.startswith(prefixes) for r in rs]
        if got:
            verdict = "held" if max(got) <= aim else "not held"
            parts.append(
                f"{name} at most {aim}x the floor: {min(got):.2f}-{max(got):.2f}x, {verdict}"
            )
    return "Against the aims (C array / floor, this run): " + "; ".join(parts) + "."


def run(quick: bool) -> str:
    """Markdown section: C and Python fast paths vs reference vs floor for every profile."""
    sizes = (10_000,) if quick else (10_000, 128_000)
    budget = 0.15 if quick else 1.2
    rows = []
    ratios: dict[str, list[float]] = {}  # C array / floor per profile, for the aims line
    for profile_id in profile_ids():
        engine = get_profile(profile_id).engine
        seed = {"root_seed": "42"} if engine in ("vllm", "llmd") else {}
        spec = make_spec(profile_id, BLOCK, vectors=False, **seed)
        ctx = KeyContext(model="bench-model") if "model" in spec.required_context else None
        for n in sizes:
            # Token ids of a realistic vocabulary (Qwen3: 151,936 ids), fixed seed.
            rng = random.Random(n)
            tokens = [rng.randrange(151_936) for _ in range(n)]
            compiled = lambda t=tokens, s=spec, c=ctx: block_keys(t, s, c)  # noqa: E731
            flat = lambda t=tokens, s=spec, c=ctx: block_key_array(t, s, c)  # noqa: E731
            fast_keys = compiled()
            ref_keys = reference_block_keys(tokens, spec, ctx)
            if not fast_keys == _python(compiled)() == ref_keys == flat():
                raise AssertionError(f"{profile_id}: a fast path differs from the reference at {n}")
            arr, fast, python, ref, floor = fastest(
                [
                    flat,
                    compiled,
                    _python(compiled),
                    lambda t=tokens, s=spec, c=ctx: reference_block_keys(t, s, c),
                    _floor(profile_id, tokens, fast_keys, spec),
                ],
                budget,
            )
            ratios.setdefault(profile_id, []).append(arr / floor)
            rows.append(
                f"| `{profile_id}` | {n:,} | {arr * 1e3:,.2f} | {arr / floor:.2f}x | "
                f"{fast * 1e3:,.2f} | {python * 1e3:,.2f} | "
                f"{ref * 1e3:,.2f} | {ref / fast:.1f}x | {floor * 1e3:,.2f} | "
                f"{fast / floor:.2f}x | {python / floor:.1f}x |"
            )
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    return "\n".join(
        [
            "## Cache keys (`bench_keys`)",
            "",
            f"Load average at the end of the run (1 / 5 / 15 min): {load}.",
            "",
            f"Block size {BLOCK}; each figure is the fastest of many back-to-back calls (GC "
            "paused, as `timeit` does), the five functions of a row taking turns in 4 rounds "
            f"for about {budget} s, so load from other processes falls on all of them; "
            "every fast result is checked "
            "byte-identical to the reference in the same run. *C array*: `block_key_array` "
            "through the compiled key core, the keys written into two flat buffers (digests, "
            "event keys) with no Python object per block, what a router needs per prompt; *C*: "
            "`block_keys` through the "
            f"compiled key core, here {native.describe()} (pickle profiles have none and stay in "
            "Python), one `BlockKey` object per block; *python*: the same call on the "
            "pure-Python fast path (`TOKENKEYS_NATIVE=0`, "
            "or no compiler at install). *reference*: per block, build the "
            "engine's object, serialize it as the engine does (`cbor2.dumps(canonical=True)`, "
            "`pickle.dumps`, per-token `hashlib` updates), hash, chain. *floor*: only the digest "
            "calls over the same per-block bytes. Pickle profiles use `pickle.dumps` on both "
            "paths, so they gain nothing.",
            "",
            _aims(ratios),
            "",
            "| profile | tokens | C array ms | C array / floor | C ms | python ms | reference ms "
            "| speedup (C) | floor ms | C / floor | python / floor |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
