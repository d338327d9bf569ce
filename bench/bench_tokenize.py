"""gRPC Tokenize against in-process encoding, one by one and batched, and gRPC's own floor."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import tokenizers
from timing import load_note, pct, sample, us

from tokenkeys.client import TokenizerClient
from tokenkeys.tokenizer import default_tokenizer_path

ROOT = Path(__file__).resolve().parent.parent
WORDS = (
    "The router must tokenize every request before it picks a worker, and the count it "
    "reports has to be the count the engine serves; otherwise prefix caches miss silently. "
).split()


def text_of(tok: tokenizers.Tokenizer, tokens: int) -> str:
    """A text of about ``tokens`` tokens."""
    words: list[str] = []
    i = 0
    while len(tok.encode(" ".join(words)).ids) < tokens:
        words.extend(WORDS[i % len(WORDS)] for i in range(i, i + 10))
        i += 10
    while len(tok.encode(" ".join(words)).ids) > tokens:
        words.pop()
    return " ".join(words)


def start_server() -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkeys.cli", "serve", "--grpc-port", "0", "--http-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    for line in proc.stdout:
        if "gRPC listening on " in line:
            return proc, line.split()[-1]
    raise RuntimeError("server did not start")


def _interleaved(calls: dict[str, Callable[[], object]], n: int) -> dict[str, list[float]]:
    """Time every call ``n`` times, taking turns, so load from other processes on a shared
    machine falls on all of them alike instead of on whichever row ran during a burst."""
    for fn in calls.values():  # warm-up
        for _ in range(20):
            fn()
    times: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(n):
        for label, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - t0)
    return times


def run(quick: bool) -> str:
    n = 300 if quick else 2000
    tok = tokenizers.Tokenizer.from_file(str(default_tokenizer_path() / "tokenizer.json"))
    proc, target = start_server()
    texts = {size: text_of(tok, size) for size in (50, 1000)}
    try:
        with TokenizerClient(target) as client:
            calls: dict[str, Callable[[], object]] = {
                "empty Tokenize call (gRPC floor)": lambda: client.tokenize([])
            }
            for size, text in texts.items():
                calls[f"{size} tokens, in-process encode"] = lambda t=text: tok.encode(t)
                # The call the server itself makes (no offsets asked): what the server adds
                # beyond its own encode is the gRPC row minus this one and the empty call.
                calls[f"{size} tokens, in-process encode_batch_fast"] = lambda t=text: (
                    tok.encode_batch_fast([t])
                )
                calls[f"{size} tokens, gRPC Tokenize"] = lambda t=text: client.tokenize([t])
            times = _interleaved(calls, n)
            empty = times["empty Tokenize call (gRPC floor)"]
            batch = [text_of(tok, 1000) + f" {i}" for i in range(64)]
            m = max(20, n // 20)
            local_b = sample(lambda: tok.encode_batch(batch), m, warmup=3)
            remote_b = sample(lambda: client.tokenize(batch), m, warmup=3)
    finally:
        proc.terminate()
        proc.wait(10)
    lines = [
        "## Tokenize over gRPC (issue 2)",
        "",
        "Server: `tokenkeys serve` on the embedded tokenizer in its own process; client: the "
        "blocking `TokenizerClient` on loopback. Reference: raw `tokenizers` encode in the "
        f"client process; the server encodes with `encode_batch_fast` (no offsets asked), which "
        "skips offset tracking, so the excess is also given over that call. "
        f"{n} calls per row, the seven calls taking turns.",
        "",
        "| call | p50 | p99 |",
        "|---|---|---|",
    ]
    for label, values in times.items():
        lines.append(f"| {label} | {us(pct(values, 50))} | {us(pct(values, 99))} |")
    e50 = pct(empty, 50)
    for size in (50, 1000):
        loc = pct(times[f"{size} tokens, in-process encode"], 50)
        rem = pct(times[f"{size} tokens, gRPC Tokenize"], 50)
        lines.append("")
        # The same difference within each round of turns, whose median shrugs off slow drifts.
        paired = [
            r - lo - e
            for r, lo, e in zip(
                times[f"{size} tokens, gRPC Tokenize"],
                times[f"{size} tokens, in-process encode"],
                empty,
                strict=True,
            )
        ]
        fast = times[f"{size} tokens, in-process encode_batch_fast"]
        remote = times[f"{size} tokens, gRPC Tokenize"]
        own = [r - f - e for r, f, e in zip(remote, fast, empty, strict=True)]
        lines.append(
            f"- {size} tokens: Tokenize p50 exceeds in-process encode + empty call by "
            f"**{us(rem - loc - e50)}** (median of the per-round difference: "
            f"{us(statistics.median(paired))}; aim at 1k: at most 100 µs). Over the server's "
            f"own encode call (`encode_batch_fast`, no offsets) + empty call: "
            f"{us(rem - pct(fast, 50) - e50)} (per-round median {us(statistics.median(own))})."
        )
    tokens_b = sum(len(e.ids) for e in tok.encode_batch(batch))
    ratio = pct(local_b, 50) / pct(remote_b, 50)
    lines += [
        f"- Batched, 64 texts × ~1k tokens ({tokens_b} tokens per call): in-process "
        f"{tokens_b / pct(local_b, 50) / 1e6:.2f} M tokens/s, gRPC "
        f"{tokens_b / pct(remote_b, 50) / 1e6:.2f} M tokens/s: **{ratio:.0%}** of in-process "
        "(aim: at least 80%).",
        "",
        load_note(),
        "",
        "Where the time of a 1k-token Tokenize goes (profiled once on this machine, 2 shared "
        "cores at load average 6-13 from other sessions, while the server still encoded with "
        "`encode_batch`, offsets included: that encode is the 12.93 M below; what the server "
        "adds around it is unchanged):",
        "",
        "| where | measure | 1k-token call | empty call |",
        "|---|---|---:|---:|",
        "| whole server process, per call | callgrind instructions | 14.37 M | 0.66 M |",
        "| tokenizers `encode` (Rust) | callgrind instructions | 12.93 M | - |",
        "| ids into the repeated field (upb `add(ids=list)`, in C) | callgrind | 0.32 M | - |",
        "| `Encoding.ids` to a Python list (tokenizers) | callgrind | 0.12 M | - |",
        "| serializing the response (upb) | callgrind | 0.07 M | - |",
        "| the rest (Preprocessor checks, result objects, request parse) | callgrind | 0.27 M "
        "| - |",
        "| servicer minus encode, p50 (timers in the server) | wall | 83 µs | 39 µs |",
        "| server main thread (py-spy, 12 s of 1k-token calls) | samples | encode 49 %, gRPC "
        "aio machinery 25 %, epoll wait 16 %, servicer besides encode 6 %, guard 2 % | |",
        "",
        "So the server adds 0.78 M instructions to a 1k-token call beyond encode and the empty "
        "call, about 6 % of the encode (60-80 µs at this machine's encode rate), three quarters "
        "of it moving 1,000 ids from Rust into protobuf, which upb already does from the list in "
        "C (a numpy varint packer was slower: converting the list to an array alone costs as "
        "much as upb's fill). The tokenizers encode itself runs in the server at the client's "
        "speed (server timers: p50 1,523 µs against 1,504 µs in the client, same run). What "
        "the wall-clock excess shows beyond that moves with the machine's load between runs "
        "(a bare grpc.aio handler doing the same encode and fill, measured interleaved with "
        "this server, came out 100-200 µs faster at 1k tokens and level on empty calls, with "
        "run-to-run spread of the same size), so it is not resolved here.",
    ]
    return "\n".join(lines)
