"""Redis for the benchmarks: ``REDIS_URL``, or a throwaway ``redis-server`` on loopback.

A Redis Cluster for them comes from the tests' harness (``tests/router/redis_cluster.py``:
3 masters and a replica each, on loopback), so both start clusters one way.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent


class LocalRedis:
    """REDIS_URL, or a throwaway redis-server; None when neither is available."""

    def __init__(self) -> None:
        self.url = os.environ.get("REDIS_URL")
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir: str | None = None
        binary = shutil.which("redis-server")
        if self.url or binary is None:
            return
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", self.dir]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(self.url)
        for _ in range(500):
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.02)
        client.close()

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def flush(self) -> None:
        client = redis.Redis.from_url(self.url)
        keys = list(client.scan_iter(match="{bench*", count=10_000))
        for start in range(0, len(keys), 10_000):
            client.delete(*keys[start : start + 10_000])
        client.close()


def start_cluster(replicas: int = 1):  # noqa: ANN201 (the harness's RedisClusterServers)
    """A fresh 3-master cluster with ``replicas`` replicas per master (``.url`` names a node,
    ``.remove()`` ends it), or None when ``redis-server``/``redis-cli`` are missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        return None
    for path in (ROOT / "tests", ROOT / "tests" / "router"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    from redis_cluster import RedisClusterServers

    return RedisClusterServers(server, cli, replicas).start()
