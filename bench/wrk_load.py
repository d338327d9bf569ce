"""HTTP load from wrk (Debian's ``wrk`` package), the load generator issue 15 was measured with.

wrk is a C event loop: per request it costs a small fraction of what the Python generator in
bench_http costs, so on a 2-core machine more of the cores go to the servers being compared.
One wrk thread, ``concurrency`` keep-alive connections, the same POST body on every request;
the rate and the p99 come from wrk's own summary (``--latency``). A reply other than 2xx fails
the row: a fast error is not a fast answer.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("{body}", "rb")
wrk.body = f:read("*a")
f:close()
"""
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def available() -> bool:
    """Whether wrk is on PATH (``apt-get install wrk``)."""
    return shutil.which("wrk") is not None


def row(url: str, body: bytes, concurrency: int, seconds: float) -> tuple[float, float]:
    """wrk for ``seconds`` (whole) against ``url`` after a 1 s warm-up; (requests/s, p99 s)."""
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as tmp:
        (Path(tmp) / "body.json").write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(_SCRIPT.format(body=Path(tmp) / "body.json"), encoding="utf-8")
        _run(url, script, concurrency, 1.0)
        return _parse(_run(url, script, concurrency, seconds))


def _run(url: str, script: Path, concurrency: int, seconds: float) -> str:
    duration = f"-d{max(1, round(seconds))}s"
    cmd = ["wrk", "-t1", f"-c{concurrency}", duration, "--latency", "-s", str(script)]
    done = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed: {done.stderr or done.stdout}")
    if "Non-2xx" in done.stdout or "Socket errors" in done.stdout:
        raise RuntimeError(f"wrk saw failed requests against {url}:\n{done.stdout}")
    return done.stdout


def _parse(out: str) -> tuple[float, float]:
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p99 = re.search(r"^\s*99%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.MULTILINE)
    if rate is None or p99 is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    return float(rate.group(1)), float(p99.group(1)) * _UNITS[p99.group(2)]
