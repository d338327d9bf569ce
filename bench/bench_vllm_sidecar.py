"""The vLLM sidecar's cost: a forwarded completion against calling vLLM directly, and the key check.

A real vLLM 0.32 (CPU, the tiny random-weight Llama of the real-engine tests, built with their
harness: ``tests/realengine``) and ``tokenkeys serve --engine vllm+http://...`` in front of it.
Requests alternate between the sidecar and vLLM itself, each with a prompt of its own (a cache
miss on both paths, same length), so both see the same machine noise. The reference is the
direct call; the sidecar's overhead is the difference of percentiles and their ratio.

The key check (:class:`tokenkeys.engine.vllm.key_check.KeyCheck`) is timed in process:
``expect`` (the prompt's keys) plus ``observe`` of the matching BlockStored batch, per request.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 49152


def _harness() -> None:
    for path in (ROOT / "tests", ROOT / "tests" / "realengine", ROOT / "src"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def _completion_times(quick: bool) -> tuple[list[float], list[float]] | str:
    """(direct seconds, through-sidecar seconds) per request, or why they could not run."""
    _harness()
    import os
    import subprocess
    import tempfile

    from cached_venv import VenvUnavailable
    from served_pair import EMBEDDED, TokenkeysServe, sidecar_args
    from vllm_env import vllm_python
    from vllm_server import MODEL_NAME, ServerConfig, TinyModel, VllmServer

    try:
        python = vllm_python()
    except VenvUnavailable as exc:
        return f"no vLLM engine environment: {exc}"
    work = Path(tempfile.mkdtemp(prefix="bench-sidecar-"))
    builder = ROOT / "tests" / "realengine" / "build_tiny_model.py"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [str(python), str(builder), str(EMBEDDED), str(work / "model")], check=True, env=env
    )
    vllm = VllmServer(python, TinyModel(work / "model", None), ServerConfig(), work)
    sidecar = None
    try:
        vllm.wait_healthy()
        sidecar = TokenkeysServe(*sidecar_args(vllm, "--kv-events-vllm-version", "0.32"))
        sidecar.wait_healthy()
        rng = random.Random(7)
        n = 30 if quick else 200
        direct, through = [], []
        with httpx.Client(timeout=300) as client:
            for i in range(n + 5):
                for url, out in ((vllm.url, direct), (sidecar.url, through)):
                    prompt = [rng.randrange(VOCAB) for _ in range(256)]
                    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 8}
                    t0 = time.perf_counter()
                    response = client.post(f"{url}/v1/completions", json=body)
                    elapsed = time.perf_counter() - t0
                    assert response.status_code == 200, response.text
                    if i >= 5:  # warm-up
                        out.append(elapsed)
        return direct, through
    finally:
        if sidecar is not None:
            sidecar.stop()
        vllm.stop()


def _key_check_times(quick: bool) -> list[tuple[int, list[float]]]:
    _harness()
    from prometheus_client import CollectorRegistry
    from timing import sample

    from tokenkeys.engine.vllm.key_check import KeyCheck, keys_checked
    from tokenkeys.events.model import BlockStored, EventBatch
    from tokenkeys.keys import block_keys, make_spec

    spec = make_spec("vllm/sha256_cbor@0.31", 32)
    check = KeyCheck(spec, "bench", keys_checked(CollectorRegistry()))
    rng = random.Random(3)
    out = []
    for length in (256, 2048):
        prompts = [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(50)]
        batches = []
        for p in prompts:
            keys = block_keys(p, spec)
            stored = BlockStored(
                tuple(k.event_key for k in keys), None, tuple(p[: len(keys) * 32]), 32
            )
            batches.append(EventBatch(0.0, (stored,)))
        turn = iter(range(10**9))

        def one(prompts=prompts, batches=batches, turn=turn) -> None:
            i = next(turn) % len(prompts)
            check.expect(prompts[i], None)
            check.observe(batches[i])

        out.append((length, sample(one, 100 if quick else 1000, warmup=10)))
    return out


def run(quick: bool) -> str:
    """Run the sidecar benchmark and return a Markdown section."""
    from timing import pct

    lines = ["## vLLM sidecar (`tokenkeys serve --engine vllm+http://...`)", ""]
    times = _completion_times(quick)
    if isinstance(times, str):
        lines.append(f"Forwarding not measured: {times}.")
    else:
        direct, through = times
        lines += [
            f"Real vLLM 0.32.0 (CPU, tiny random-weight Llama, 32-token blocks), {len(direct)} "
            "sequential completions per path, alternating: 256 prompt tokens (a fresh prompt "
            "each, a cache miss on both paths), max_tokens=8, non-streamed. The sidecar "
            "tokenizes nothing here (token-id prompts), passes the request to vLLM whole, "
            "checks the keys.",
            "",
            "| | direct to vLLM | through the sidecar | overhead | ratio |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for q in (50, 99):
            d, s = pct(direct, q), pct(through, q)
            lines.append(
                f"| p{q} | {d * 1e3:.1f} ms | {s * 1e3:.1f} ms | {(s - d) * 1e3:+.1f} ms | "
                f"{s / d:.2f}x |"
            )
    lines += [
        "",
        "Key check per request (in process: the prompt's keys, then matching its BlockStored "
        "batch), `vllm/sha256_cbor@0.31`:",
        "",
        "| prompt tokens | p50 | p99 |",
        "| ---: | ---: | ---: |",
    ]
    for length, values in _key_check_times(quick):
        lines.append(
            f"| {length:,} | {pct(values, 50) * 1e6:,.0f} µs | {pct(values, 99) * 1e6:,.0f} µs |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    print(run(quick=True))
