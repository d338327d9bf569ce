"""gRPC against HTTP on the same server: Tokenize and Generate, one C load generator for both.

One ``tokenkeys serve`` (the embedded model, the simulated engine, default settings) answers
both faces. Per prompt size (63 and 1,023 tokens) and connection count (1 and 16), h2load
(bench/h2load_run.py) drives HTTP/1.1 ``/tokenize`` and gRPC ``OpenEngineTokenizer.Tokenize``
with the same text, then HTTP ``/v1/completions`` and gRPC ``Inference.Generate`` with the same
prompt and ``max_tokens`` 1 (one streamed token and the usage). The two faces of a pair take
turns, ``ROUNDS`` times; each cell is the median round. Before each pair one real client call
per face checks the answer (same count, a finished generation). Reference: the same server's
HTTP rate in the same run; the ratio is gRPC over HTTP.
"""

from __future__ import annotations

import os
import statistics

import grpc
import h2load_run
import httpx
import orjson
from bench_http import text_of
from bench_workers import _serve, _stop

from tokenkeys._gen.openengine.v1 import (
    generation_pb2,
    openengine_pb2_grpc,
    tokenizer_pb2,
    tokenizer_pb2_grpc,
)
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

SIZES = (64, 1024)
CONCURRENCY = (1, 16)
ROUNDS = 3


def _bodies(text: str, model: str) -> dict[str, tuple[str, bytes]]:
    """(path, body) per face and call."""
    tokenize = tokenizer_pb2.TokenizeRequest(texts=[text])
    generate = generation_pb2.GenerateRequest(
        model=model, prompt=text, stopping=generation_pb2.StoppingOptions(max_tokens=1)
    )
    return {
        "http tokenize": ("/tokenize", orjson.dumps({"model": model, "prompt": text})),
        "grpc tokenize": (
            "/openengine.v1.OpenEngineTokenizer/Tokenize",
            h2load_run.grpc_frame(tokenize.SerializeToString()),
        ),
        "http generate": (
            "/v1/completions",
            orjson.dumps({"model": model, "prompt": text, "max_tokens": 1}),
        ),
        "grpc generate": (
            "/openengine.v1.Inference/Generate",
            h2load_run.grpc_frame(generate.SerializeToString()),
        ),
    }


def _check(grpc_target: str, http: str, text: str, model: str, tokens: int) -> None:
    """One real call per face: the counts agree and a generation finishes."""
    with grpc.insecure_channel(grpc_target) as channel:
        answer = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel).Tokenize(
            tokenizer_pb2.TokenizeRequest(texts=[text]), timeout=30
        )
        assert answer.results[0].count == tokens, answer
        stream = openengine_pb2_grpc.InferenceStub(channel).Generate(
            generation_pb2.GenerateRequest(
                model=model, prompt=text, stopping=generation_pb2.StoppingOptions(max_tokens=1)
            ),
            timeout=30,
        )
        assert list(stream)[-1].WhichOneof("event") == "finished"
    body = {"model": model, "prompt": text}
    assert httpx.post(f"http://{http}/tokenize", json=body, timeout=30).json()["count"] == tokens
    done = httpx.post(f"http://{http}/v1/completions", json={**body, "max_tokens": 1}, timeout=30)
    assert done.json()["usage"]["prompt_tokens"] == tokens


def _cell(rounds: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds)


def run(quick: bool) -> str:
    """Measure every row; return the Markdown section."""
    title = "## gRPC against HTTP on one server (bench_grpc_speed)"
    if not h2load_run.available():
        return f"{title}\n\nNot run: h2load is not installed (`apt-get install nghttp2-client`).\n"
    model = load_models([ModelSource.default()], TokenizerOptions(), Limits()).get(None)
    seconds, rounds = (2, 1) if quick else (5, ROUNDS)
    load_before = os.getloadavg()[0]
    proc, grpc_target, http = _serve()
    lines = [
        title,
        "",
        f"`tokenkeys serve` (the embedded {model.name}, simulated engine, defaults); h2load, one "
        f"thread, one request in flight per connection, {seconds} s per cell after a 1 s "
        f"warm-up, median of {rounds} rounds in which the two faces take turns. Generate: "
        "`max_tokens` 1. Cells: requests/s and p99; ratio = gRPC / HTTP, same row.",
        "",
        "| prompt tokens | connections | HTTP /tokenize | gRPC Tokenize | ratio | "
        "HTTP /v1/completions | gRPC Generate | ratio |",
        "|---:|---:|---|---|---:|---|---|---:|",
    ]
    try:
        for size in SIZES:
            text = text_of(model.preprocessor, size)
            tokens = model.preprocessor.tokenize_prompts([text])[0].count
            _check(grpc_target, http, text, model.name, tokens)
            bodies = _bodies(text, model.name)
            for concurrency in CONCURRENCY:
                cells = {}
                for pair in (
                    ("http tokenize", "grpc tokenize"),
                    ("http generate", "grpc generate"),
                ):
                    measured: dict[str, list] = {name: [] for name in pair}
                    for _ in range(rounds):
                        for name in pair:
                            path, body = bodies[name]
                            host = grpc_target if name.startswith("grpc") else http
                            measured[name].append(
                                h2load_run.row(
                                    f"http://{host}{path}",
                                    body,
                                    concurrency,
                                    seconds,
                                    grpc=name.startswith("grpc"),
                                )
                            )
                    cells.update({name: _cell(m) for name, m in measured.items()})
                row = f"| {tokens} | {concurrency} |"
                for ref, ours in (
                    ("http tokenize", "grpc tokenize"),
                    ("http generate", "grpc generate"),
                ):
                    (rh, ph), (rg, pg) = cells[ref], cells[ours]
                    row += (
                        f" {rh:,.0f}, p99 {1000 * ph:.1f} ms | {rg:,.0f}, p99 {1000 * pg:.1f} ms "
                        f"| **{rg / rh:.2f}** |"
                    )
                lines.append(row)
    finally:
        _stop(proc)
    lines += [
        "",
        f"Load average (1 min) on the machine: {load_before:.1f} before the run, "
        f"{os.getloadavg()[0]:.1f} after it (2 cores; other work shares them, and both faces "
        "take their turns under it).",
        "",
        PROFILE,
    ]
    return "\n".join(lines) + "\n"


#: Measured once each (not by this run): py-spy 0.4 at 200 Hz on the server process while h2load
#: sent 63-token calls over one connection, on this 2-core machine under other work.
PROFILE = (
    "Where a gRPC call's time goes (py-spy on the server, 63-token calls over one connection, "
    "each measured once while other work shared the machine). **Generate** (`max_tokens` 1; "
    "8 s, 1,599 samples of the event loop's thread, load average about 8): 44 % waiting in "
    "epoll, 34 % in grpc.aio's Cython call handling (the completion-queue callbacks the loop "
    "runs, `Handle._run` with no Python frame below it), 12.5 % in tokenkeys' code (5 % the "
    "simulated engine's generate, 4 % reading the request and tokenizing the prompt through the "
    "Preprocessor, 1 % building the token and finished messages, 1 % the call guards, the rest "
    "the servicer), 1 % in the tokenizers encode; grpc's poller thread runs beside the loop. "
    "The first call also paid a one-off 0.5 s: the lazy parse of tokenizer.json for the token "
    "floor (`Tokenizer.token_floor`), later calls never again. The same server's "
    "`/v1/completions` spends 71 % waiting, 24 % in the app (FastAPI and the completions "
    "path), 2 % in uvicorn. **Tokenize** (10 s, 2,086 samples): 41 % grpc.aio's Cython call "
    "handling, 22 % grpc's poller thread, 24 % waiting in epoll, 7 % the encode, 3 % "
    "tokenkeys' servicer, guard and offload decision. So the part tokenkeys could cut is small "
    "(all of it would move Generate by an eighth at most): the per-call cost is the Python gRPC "
    "stack's, a write through the C core per streamed message (two per Generate: the token and "
    "`GenerationFinished`, then the trailing metadata) and a thread hop from the poller to "
    "wake the loop. What would remove it: a gRPC server outside Python's event loop (grpc's "
    "C++ core or Rust's tonic serving the call and calling the engine and tokenizer directly), "
    "or more processes (`serve --processes N`, bench_workers). With one C client (h2load) for "
    "both faces, gRPC is at or above HTTP wherever the table says so; the earlier 0.82x of "
    "bench_vs_vllm drove gRPC from a Python client and HTTP from wrk."
)
