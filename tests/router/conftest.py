"""Fixtures of the router tests: a real Redis server, and the prefix-index backends.

Redis: ``REDIS_URL`` when set (CI may start one), otherwise a ``redis-server`` started here on a
free loopback port with a temporary directory and no persistence; without the binary the Redis
tests skip with the reason (install it with ``apt-get install -y redis-server``). Redis Cluster:
``REDIS_CLUSTER_URL`` (any node) when set, otherwise six ``redis-server`` processes in cluster
mode started here (``redis_cluster.py``: 3 masters, a replica each).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis
from evidence import unavailable
from ports import free_port
from redis_cluster import RedisClusterServers, drop_namespaces

from tokenkeys.router.index import table
from tokenkeys.router.index.instrumented import InstrumentedIndex
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.index.redis import RedisPrefixIndex
from tokenkeys.router.workers.pool_setup import PoolSettings


class RedisServer:
    """A ``redis-server`` child process on a loopback port; stoppable and restartable."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="tokenkeys-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start on the same port as before (a restart comes back empty: no persistence)."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", self.dir]
        log = os.path.join(self.dir, "redis.log")
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.exceptions.RedisError as exc:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        with open(log, errors="replace") as f:
                            tail = f.read()[-2000:]
                        raise RuntimeError(f"redis-server did not start: {tail}") from exc
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_binary() -> str:
    """The ``redis-server`` on PATH; tests that need one skip, naming the package, without it."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server is not on PATH (Debian: apt-get install -y redis-server)")
    return binary


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis everyone in this session shares; tests isolate themselves by namespace.

    ``REDIS_URL`` when set; otherwise a ``redis-server`` started here for the session.
    """
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    server = RedisServer(request.getfixturevalue("redis_binary"))
    try:
        yield server.start().url
    finally:
        server.remove()


@pytest.fixture
def start_redis(redis_binary: str) -> Iterator[Callable[[], RedisServer]]:
    """Factory of dedicated, started servers a test may stop and restart; removed afterwards."""
    servers: list[RedisServer] = []

    def start() -> RedisServer:
        servers.append(RedisServer(redis_binary))
        return servers[-1].start()

    try:
        yield start
    finally:
        for server in servers:
            server.remove()


@pytest.fixture(scope="session")
def redis_cluster(redis_binary: str) -> Iterator[RedisClusterServers]:
    """A Redis Cluster of 3 masters and 3 replicas the whole session shares (by namespace)."""
    cli = shutil.which("redis-cli")
    if cli is None:
        unavailable("redis-cli is not on PATH (Debian: apt-get install -y redis-server)")
    servers = RedisClusterServers(redis_binary, cli)
    try:
        yield servers.start()
    finally:
        servers.remove()


@pytest.fixture(scope="session")
def redis_cluster_url(request: pytest.FixtureRequest) -> str:
    """Any node of a Redis Cluster: ``REDIS_CLUSTER_URL``, or the session's own cluster."""
    return os.environ.get("REDIS_CLUSTER_URL") or request.getfixturevalue("redis_cluster").url


class Backend:
    """Makes prefix indexes of one backend for one test, and cleans up after it.

    ``redis``: a single Redis, one shard (the layout of earlier releases); ``sharded``: the same
    Redis with the cluster layout (8 shards); ``cluster``: a real Redis Cluster.
    """

    def __init__(self, name: str, url: str | None) -> None:
        self.name = name
        self.url = url
        self.made: list[PrefixIndex] = []
        self.namespaces: list[str] = []

    def new(self, **options: object) -> PrefixIndex:
        """A fresh, empty index (Redis: in a namespace of its own)."""
        if self.name in ("memory", "memory-python"):
            index: PrefixIndex = MemoryPrefixIndex(**options)
        elif self.name == "instrumented":
            index = InstrumentedIndex(MemoryPrefixIndex(**options))
        else:
            namespace = f"t-{uuid.uuid4().hex[:12]}"
            self.namespaces.append(namespace)
            if self.name == "sharded":
                options.setdefault("shards", 8)
            index = RedisPrefixIndex.from_url(self.url, namespace=namespace, **options)
        self.made.append(index)
        return index

    def replica(self, index: RedisPrefixIndex, **options: object) -> RedisPrefixIndex:
        """Another index instance (another client) on the same Redis data."""
        other = RedisPrefixIndex.from_url(self.url, namespace=index.namespace, **options)
        self.made.append(other)
        return other

    async def close(self) -> None:
        for index in self.made:
            await index.close()
        if self.namespaces and self.url:
            drop_namespaces(self.url, self.namespaces)


@pytest.fixture(params=["memory", "memory-python", "redis", "sharded", "cluster", "instrumented"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """Each conformance test runs once per backend (and once through the metrics wrapper);
    ``memory`` on the compiled key table where built, ``memory-python`` on the pure-Python one."""
    url = None
    if request.param == "memory-python":
        request.getfixturevalue("monkeypatch").setattr(table, "CORE", None)
    elif request.param in ("redis", "sharded"):
        url = request.getfixturevalue("redis_url")
    elif request.param == "cluster":
        url = request.getfixturevalue("redis_cluster_url")
    made = Backend(request.param, url)
    yield made
    await made.close()


@pytest.fixture
async def redis_backend(redis_url: str) -> AsyncIterator[Backend]:
    """The Redis backend alone, for what only a shared index does."""
    made = Backend("redis", redis_url)
    yield made
    await made.close()


@pytest.fixture
async def cluster_backend(redis_cluster_url: str) -> AsyncIterator[Backend]:
    """The index on the Redis Cluster alone, for what only a cluster does."""
    made = Backend("cluster", redis_cluster_url)
    yield made
    await made.close()


@pytest.fixture
def settings(tmp_path) -> PoolSettings:  # noqa: ANN001
    """Pool settings with the test's own artifact cache (tokenizers are built into it)."""
    return PoolSettings(cache=tmp_path / "cache")
