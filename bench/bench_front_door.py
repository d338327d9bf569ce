"""What the router's front door adds to a request over calling the worker directly.

One ``tokenkeys serve`` (the simulated engine, no simulated sleeps, so the worker answers in
well under a millisecond of engine time) with its HTTP frontend, and ``tokenkeys route
--worker`` in front of it, each in its own process. The same small completion request
(``max_tokens`` 1) is sent straight to the worker's frontend (the reference) and through the
router (tokenize with the pool's Preprocessor, keys, index lookup, decision, then the forward
to the same frontend), alternating in blocks so both see the same machine load; one
connection, then 16 concurrent ones. The difference of the percentiles is what the router adds.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from bench_http import serve
from timing import cpu_seconds, load_note, pct

ROOT = Path(__file__).resolve().parent.parent
BODY = {
    "prompt": "The router must tokenize every request before it picks a worker. " * 8,
    "max_tokens": 1,
    "temperature": 0,
}


def route(worker: str, cache: Path) -> tuple[subprocess.Popen, str]:
    """``tokenkeys route --worker WORKER`` on a free port; (process, base URL)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkeys.cli", "route", "--http-port", "0", "--worker", worker],
        stdout=subprocess.PIPE,
        stderr=open(cache / "route.log", "w"),  # noqa: SIM115 - the process keeps it
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "TOKENKEYS_CACHE": str(cache)},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "HTTP listening on " in line:
            return proc, "http://" + line.split()[-1]
    raise RuntimeError("tokenkeys route did not start")


async def _latencies(url: str, connections: int, per_connection: int) -> list[float]:
    limits = httpx.Limits(
        max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=1.0
    )
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one_connection() -> list[float]:
            out = []
            for _ in range(per_connection):
                t0 = time.perf_counter()
                response = await client.post("/v1/completions", json=BODY)
                out.append(time.perf_counter() - t0)
                assert response.status_code == 200, response.text
            return out

        runs = await asyncio.gather(*(one_connection() for _ in range(connections)))
    return [t for run in runs for t in run]


def _measure(
    urls: dict[str, str], connections: int, n: int, blocks: int, pids: dict[str, int]
) -> tuple[dict[str, list], dict[str, float]]:
    """Latencies per path, the paths alternating in ``blocks`` blocks; and per path the CPU
    seconds per request of the process it calls (user + system, all its threads): the
    worker's while it is called directly, the router's while it forwards."""
    out: dict[str, list] = {name: [] for name in urls}
    per = max(1, n // blocks // connections)
    for url in urls.values():  # warm both (connections, caches)
        asyncio.run(_latencies(url, connections, 5))
    cpu = dict.fromkeys(urls, 0.0)
    for _ in range(blocks):
        for name, url in urls.items():
            before = cpu_seconds(pids[name])
            out[name] += asyncio.run(_latencies(url, connections, per))
            cpu[name] += cpu_seconds(pids[name]) - before
    return out, {name: cpu[name] / max(1, len(out[name])) for name in urls}


def _wait_routable(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.get(url + "/router/workers", timeout=5).json()["pools"]:
            response = httpx.post(url + "/v1/completions", json=BODY, timeout=30)
            if response.status_code == 200 and "x-tokenkeys-retries" in response.headers:
                return
        time.sleep(0.2)
    raise RuntimeError("the router did not admit and forward to the worker")


def run(quick: bool) -> str:
    """The Markdown section of this benchmark."""
    import tempfile

    n = 400 if quick else 2000
    worker, target, address = serve()
    router = None
    try:
        router, router_url = route(target, Path(tempfile.mkdtemp(prefix="tk-bench-door-")))
        _wait_routable(router_url)
        urls = {"worker": f"http://{address}", "router": router_url}
        rows = []
        for connections in (1, 16):
            pids = {"worker": worker.pid, "router": router.pid}
            got, cpu = _measure(urls, connections, n, blocks=4, pids=pids)
            w50, w99 = pct(got["worker"], 50), pct(got["worker"], 99)
            r50, r99 = pct(got["router"], 50), pct(got["router"], 99)
            rows.append(
                f"| {connections} | {w50 * 1e3:.2f} / {w99 * 1e3:.2f} | "
                f"{r50 * 1e3:.2f} / {r99 * 1e3:.2f} | {(r50 - w50) * 1e3:.2f} / "
                f"{(r99 - w99) * 1e3:.2f} | {r50 / w50:.2f}x / {r99 / w99:.2f}x | "
                f"{cpu['worker'] * 1e3:.2f} | {cpu['router'] * 1e3:.2f} | "
                f"{cpu['router'] / cpu['worker']:.2f}x |"
            )
    finally:
        for proc in (router, worker):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=20)
    return "\n".join(
        [
            "## Front door: what the router adds over calling the worker",
            "",
            "`bench/bench_front_door.py`: the same completion request (a 100-token prompt, "
            "`max_tokens` 1) straight to a `tokenkeys serve` HTTP frontend (simulated engine, "
            "no sleeps) and through `tokenkeys route` in front of it (tokenize, keys, index, "
            "decision, forward), each path in its own process, alternating in blocks; "
            f"{n} requests per path and row. Latency in ms, p50 / p99. CPU: user + system CPU "
            "time per request (`/proc`, all threads) of the worker process while it is called "
            "directly, and of the router process while it forwards (the worker's own share "
            "then is the same as direct), which load from other processes does not inflate: "
            "on an idle core the router's is about what it adds to one request.",
            "",
            "| connections | worker direct | through the router | added | ratio "
            "| worker CPU ms | router CPU ms | CPU ratio |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            load_note(),
        ]
    )


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
    print(run("--quick" in sys.argv))
