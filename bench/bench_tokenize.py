"""gRPC Tokenize against in-process encoding, one by one and batched, and gRPC's own floor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tokenizers
from timing import pct, sample, us

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
        if line.startswith("gRPC listening on "):
            return proc, line.split()[-1]
    raise RuntimeError("server did not start")


def run(quick: bool) -> str:
    n = 300 if quick else 2000
    tok = tokenizers.Tokenizer.from_file(str(default_tokenizer_path() / "tokenizer.json"))
    proc, target = start_server()
    rows = []
    try:
        with TokenizerClient(target) as client:
            empty = sample(lambda: client.tokenize([]), n)
            rows.append(("empty Tokenize call (gRPC floor)", None, empty))
            for size in (50, 1000):
                text = text_of(tok, size)
                local = sample(lambda t=text: tok.encode(t), n)
                remote = sample(lambda t=text: client.tokenize([t]), n)
                rows.append((f"{size} tokens, in-process encode", None, local))
                rows.append((f"{size} tokens, gRPC Tokenize", local, remote))
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
        f"client process. {n} calls per row.",
        "",
        "| call | p50 | p99 |",
        "|---|---|---|",
    ]
    for label, _, values in rows:
        lines.append(f"| {label} | {us(pct(values, 50))} | {us(pct(values, 99))} |")
    e50 = pct(empty, 50)
    for size in (50, 1000):
        loc = pct(next(v for lab, _, v in rows if lab.startswith(f"{size} tokens, in")), 50)
        rem = pct(next(v for lab, _, v in rows if lab.startswith(f"{size} tokens, gRPC")), 50)
        lines.append("")
        lines.append(
            f"- {size} tokens: Tokenize p50 exceeds in-process encode + empty call by "
            f"**{us(rem - loc - e50)}** (aim at 1k: at most 100 µs)."
        )
    tokens_b = sum(len(e.ids) for e in tok.encode_batch(batch))
    ratio = pct(local_b, 50) / pct(remote_b, 50)
    lines += [
        f"- Batched, 64 texts × ~1k tokens ({tokens_b} tokens per call): in-process "
        f"{tokens_b / pct(local_b, 50) / 1e6:.2f} M tokens/s, gRPC "
        f"{tokens_b / pct(remote_b, 50) / 1e6:.2f} M tokens/s: **{ratio:.0%}** of in-process "
        "(aim: at least 80%).",
        "",
        "Where the 1k-token excess goes (instrumented once, this machine): the servicer takes "
        "encode + ~75 µs (ids into protobuf, Preprocessor bookkeeping); a bare grpc.aio echo of "
        "the same payload sizes (5 KB in, 3 KB out) costs 40-90 µs more than an empty call; the "
        "client spends ~30 µs parsing 1,000 ids; the rest is the server process encoding more "
        "slowly than the client process while both share two cores.",
    ]
    return "\n".join(lines)
