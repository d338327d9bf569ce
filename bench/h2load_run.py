"""One load generator for HTTP/1.1 and gRPC: nghttp2's ``h2load`` (Debian's ``nghttp2-client``).

wrk speaks HTTP/1.1 only and a Python gRPC client costs the 2-core machine more CPU per call than
the server it measures, so comparing a server's gRPC with its HTTP needs one C client for both.
h2load sends the same prebuilt body on every request: a JSON body over HTTP/1.1 (``--h1``), or a
length-prefixed protobuf message over HTTP/2 with gRPC's headers (``application/grpc``,
``te: trailers``); one request in flight per connection (``-m 1``) in both, one thread. The rate
is requests over the measured span; the p99 comes from h2load's per-request log. h2load does
not read gRPC trailers, so every body is first sent once by a real client that checks the answer
(the caller's job); a reply other than HTTP 2xx fails the row.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from timing import pct


def available() -> bool:
    """Whether h2load is on PATH (``apt-get install nghttp2-client``)."""
    return shutil.which("h2load") is not None


def grpc_frame(message: bytes) -> bytes:
    """A gRPC message as it travels in the HTTP/2 body: uncompressed, 4-byte big-endian size."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


@dataclass(frozen=True)
class Measured:
    """One h2load run: requests/s over the measured span, p99 latency (s), requests logged."""

    rate: float
    p99: float
    requests: int


def row(
    url: str, body: bytes, concurrency: int, seconds: int, *, grpc: bool, warm_up: int = 1
) -> Measured:
    """``seconds`` of load on ``url`` after a ``warm_up`` s warm-up (whose requests h2load
    does not log: with 0, every request sent is counted)."""
    with tempfile.TemporaryDirectory(prefix="bench-h2load-") as tmp:
        data, log = Path(tmp) / "body", Path(tmp) / "log.tsv"
        data.write_bytes(body)
        args = ["h2load", "-t", "1", "-c", str(concurrency), "-m", "1", "-D", str(seconds)]
        args += ["-d", str(data), "--log-file", str(log)]
        if warm_up:
            args += ["--warm-up-time", str(warm_up)]
        if grpc:
            args += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        else:
            args += ["--h1", "-H", "content-type: application/json"]
        done = subprocess.run([*args, url], capture_output=True, text=True, timeout=seconds + 60)
        if done.returncode != 0:
            raise RuntimeError(f"h2load failed: {done.stderr[-500:]}")
        statuses = re.search(
            r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", done.stdout
        )
        assert statuses, done.stdout
        ok, *bad = (int(x) for x in statuses.groups())
        if any(bad) or not ok:
            raise RuntimeError(f"h2load got non-2xx replies from {url}: {done.stdout[-800:]}")
        lines = [line.split("\t") for line in log.read_text().splitlines() if line]
        starts = [int(c[0]) for c in lines]
        latencies = [int(c[2]) / 1e6 for c in lines]
        ends = [s / 1e6 + lat for s, lat in zip(starts, latencies, strict=True)]
        span = max(ends) - min(starts) / 1e6
        return Measured(len(lines) / span, pct(latencies, 99), len(lines))
