"""gRPC against HTTP on the same server: Tokenize and Generate, one C load generator for both.

One ``tokenkeys serve`` (the embedded model, the simulated engine, default settings) answers
both faces. Per prompt size (63 and 1,023 tokens) and connection count (1 and 16), h2load
(bench/h2load_run.py) drives HTTP/1.1 ``/tokenize`` and gRPC ``OpenEngineTokenizer.Tokenize``
with the same text, then HTTP ``/v1/completions`` and gRPC ``Inference.Generate`` with the same
prompt and ``max_tokens`` 1 (one streamed token and the usage). The two faces of a pair take
turns in short slices, ``ROUNDS`` times, after one warm-up slice each; each cell is the median
slice. Before each pair one real client call per face checks the answer (same count, a finished
generation). Reference: the same server's HTTP in the same run; the ratio is gRPC over HTTP.

Two measures per cell. Requests/s and p99 are wall-clock figures, which other work on a shared
machine moves from one slice to the next. The server's own CPU time per request (user + system
of the server process over the slice, from ``/proc``, over the requests h2load sent in it) is
what a call costs the server whatever else runs; its ratio (HTTP's CPU per request over
gRPC's) is the throughput ratio a server that has a core to itself would show.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import grpc
import h2load_run
import httpx
import orjson
from bench_http import text_of
from bench_workers import _serve, _stop
from timing import cpu_seconds

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
ROUNDS = 5
#: Seconds of one measured slice (and of the warm-up slice before a cell's rounds).
SLICE_S = 3


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


@dataclass(frozen=True)
class Slice:
    """One face's slice: requests/s, p99 (s), server CPU seconds per request."""

    rate: float
    p99: float
    cpu: float


def _slice(pid: int, url: str, body: bytes, concurrency: int, seconds: int, grpc: bool) -> Slice:
    before = cpu_seconds(pid)
    got = h2load_run.row(url, body, concurrency, seconds, grpc=grpc, warm_up=0)
    return Slice(got.rate, got.p99, (cpu_seconds(pid) - before) / max(got.requests, 1))


def _cell(slices: list[Slice]) -> Slice:
    return Slice(
        *(statistics.median(getattr(s, f) for s in slices) for f in ("rate", "p99", "cpu"))
    )


def run(quick: bool) -> str:
    """Measure every row; return the Markdown section."""
    title = "## gRPC against HTTP on one server (bench_grpc_speed)"
    if not h2load_run.available():
        return f"{title}\n\nNot run: h2load is not installed (`apt-get install nghttp2-client`).\n"
    model = load_models([ModelSource.default()], TokenizerOptions(), Limits()).get(None)
    seconds, rounds = (1, 1) if quick else (SLICE_S, ROUNDS)
    load_before = os.getloadavg()[0]
    proc, grpc_target, http = _serve()
    pairs = (("http tokenize", "grpc tokenize"), ("http generate", "grpc generate"))
    header = (
        "| prompt tokens | connections | HTTP /tokenize | gRPC Tokenize | ratio | "
        "HTTP /v1/completions | gRPC Generate | ratio |"
    )
    wall = [header, "|---:|---:|---|---|---:|---|---|---:|"]
    cpu = [header, "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    try:
        for size in SIZES:
            text = text_of(model.preprocessor, size)
            tokens = model.preprocessor.tokenize_prompts([text])[0].count
            _check(grpc_target, http, text, model.name, tokens)
            bodies = _bodies(text, model.name)
            for concurrency in CONCURRENCY:
                cells: dict[str, Slice] = {}
                for pair in pairs:
                    measured: dict[str, list[Slice]] = {name: [] for name in pair}
                    for warm_up in [True] + [False] * rounds:
                        for name in pair:
                            path, body = bodies[name]
                            grpc_face = name.startswith("grpc")
                            host = grpc_target if grpc_face else http
                            url = f"http://{host}{path}"
                            got = _slice(proc.pid, url, body, concurrency, seconds, grpc_face)
                            if not warm_up:
                                measured[name].append(got)
                    cells.update({name: _cell(m) for name, m in measured.items()})
                wall_row = cpu_row = f"| {tokens} | {concurrency} |"
                for ref, ours in pairs:
                    h, g = cells[ref], cells[ours]
                    wall_row += (
                        f" {h.rate:,.0f}, p99 {1000 * h.p99:.1f} ms | {g.rate:,.0f}, p99 "
                        f"{1000 * g.p99:.1f} ms | **{g.rate / h.rate:.2f}** |"
                    )
                    cpu_row += (
                        f" {1e6 * h.cpu:,.0f} | {1e6 * g.cpu:,.0f} | **{h.cpu / g.cpu:.2f}** |"
                    )
                wall.append(wall_row)
                cpu.append(cpu_row)
    finally:
        _stop(proc)
    lines = [
        title,
        "",
        f"`tokenkeys serve` (the embedded {model.name}, simulated engine, defaults); h2load, one "
        f"thread, one request in flight per connection; the two faces take turns in {seconds} s "
        f"slices, {rounds} each after one warm-up slice, and each cell is the median slice. "
        "Generate: `max_tokens` 1.",
        "",
        "Wall clock: requests/s and p99; ratio = gRPC / HTTP, same row.",
        "",
        *wall,
        "",
        "The server's CPU time per request (µs, user + system of the server process over the "
        "slice); ratio = HTTP's over gRPC's, the throughput ratio of a server with a core to "
        "itself:",
        "",
        *cpu,
        "",
        f"Load average (1 min) on the machine: {load_before:.1f} before the run, "
        f"{os.getloadavg()[0]:.1f} after it (2 cores; other work shares them, and both faces "
        "take their turns under it: the wall-clock figures move with it, the CPU per request "
        "much less).",
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
    "or more processes (`serve --processes N`, bench_workers). By the server's CPU per call, "
    "gRPC costs more than HTTP: that is the grpc.aio share above, which cutting tokenkeys' own "
    "part cannot make up. Under heavy load the wall-clock table can show gRPC ahead all the "
    "same (runs at load average 12 did): the gRPC server runs two busy threads, the loop and "
    "grpc's poller, and a loaded machine's scheduler gives them more CPU between them than the "
    "HTTP face's one; the CPU table does not move that way."
)
