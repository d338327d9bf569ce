"""HTTP /tokenize under concurrent load against in-process Preprocessor throughput.

The server is ``tokenkeys serve`` in a subprocess; the load generator runs in this process on
raw keep-alive HTTP/1.1 connections (prebuilt requests, minimal parsing) so that its own cost
stays small next to the server's. The reference is the same Preprocessor call made in this
process, one request at a time, on the same texts.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
from timing import pct, sample

from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import load_models
from tokenkeys.tokenizer import TokenizerOptions

ROOT = Path(__file__).resolve().parent.parent
WORDS = (
    "The router must tokenize every request before it picks a worker, and the count it "
    "reports has to be the count the engine serves; otherwise prefix caches miss silently. "
).split()


def text_of(preprocessor, tokens: int) -> str:  # noqa: ANN001
    """A text of about ``tokens`` tokens (at most that many; words do not split)."""

    def count(words: list[str]) -> int:
        return preprocessor.tokenize_prompts([" ".join(words)])[0].count

    words: list[str] = []
    while count(words) < tokens:
        words.extend(WORDS)
    while count(words) > tokens:
        words.pop()
    return " ".join(words)


def serve(*args: str) -> tuple[subprocess.Popen, str, str]:
    """``tokenkeys serve ARGS`` on free ports; (process, gRPC target, HTTP host:port)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkeys.cli", "serve", "--grpc-port", "0", "--http-port", "0"]
        + list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.stdout is not None
    target = ""
    for line in proc.stdout:
        if "gRPC listening on " in line:
            target = line.split()[-1]
        if "HTTP listening on " in line:
            return proc, target, line.split()[-1]
    raise RuntimeError("tokenkeys serve did not start")


def start_server() -> tuple[subprocess.Popen, str, int]:
    proc, _, address = serve()
    host, port = address.rsplit(":", 1)
    return proc, host, int(port)


def request_bytes(host: str, body: bytes) -> bytes:
    head = (
        f"POST /tokenize HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes
) -> bytes:
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    return await reader.readexactly(length)


async def load(
    host: str, port: int, req: bytes, concurrency: int, total: int
) -> tuple[float, list[float]]:
    """Send ``total`` requests over ``concurrency`` connections; wall time and latencies."""
    conns = [await asyncio.open_connection(host, port) for _ in range(concurrency)]
    for reader, writer in conns:  # warm every connection
        await _exchange(reader, writer, req)
    latencies: list[float] = []
    remaining = total

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            await _exchange(reader, writer, req)
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker(r, w) for r, w in conns))
    wall = time.perf_counter() - started
    for _, writer in conns:
        writer.close()
    return wall, latencies


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def run(quick: bool) -> str:
    total = 400 if quick else 3000
    pre = load_models([], TokenizerOptions(), Limits()).get(None).preprocessor
    proc, host, port = start_server()
    rows = []
    try:
        for size in (64, 1024):
            text = text_of(pre, size)
            body = orjson.dumps({"prompt": text})
            req = request_bytes(host, body)
            check = orjson.loads(asyncio.run(_check(host, port, req)))
            tokens = pre.tokenize_prompts([text])[0].count
            assert check["count"] == tokens, (check["count"], tokens)
            local = sample(lambda t=text: pre.tokenize_prompts([t]), total)
            local_rate = len(local) / sum(local)
            for concurrency in (1, 16):
                wall, lat = asyncio.run(load(host, port, req, concurrency, total))
                rate = len(lat) / wall
                rows.append(
                    f"| {tokens} | {concurrency} | {rate:,.0f} | {local_rate:,.0f} | "
                    f"{rate / local_rate:.0%} | {_ms(pct(lat, 50))} | {_ms(pct(lat, 99))} | "
                    f"{_ms(pct(local, 50))} |"
                )
    finally:
        proc.terminate()
        proc.wait(10)
    return "\n".join(
        [
            "## HTTP /tokenize under load",
            "",
            f"`tokenkeys serve` (embedded SmolLM2 tokenizer) in a subprocess; {total} "
            "completion-form /tokenize requests per row from a loopback load generator on "
            "keep-alive connections (one per unit of concurrency), against the same "
            "Preprocessor call in this process, one at a time. Server and load generator share "
            "the machine's cores.",
            "",
            "| prompt tokens | concurrency | HTTP req/s | in-process calls/s | ratio | "
            "HTTP p50 | HTTP p99 | in-process p50 |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "Aims: at 1k tokens, HTTP throughput at least 60% of in-process; at 64 tokens and "
            "concurrency 16, p99 under 20 ms.",
        ]
    )


async def _check(host: str, port: int, req: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        return await _exchange(reader, writer, req)
    finally:
        writer.close()


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
