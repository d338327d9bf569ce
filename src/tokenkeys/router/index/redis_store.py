"""One connection to Redis or Redis Cluster for the router's shared state: scripts, pipelines.

:class:`RedisStore` hides which of the two it talks to. Given a URL it connects lazily: the
first call asks the named server ``INFO cluster``; a cluster node gets redis-py's
``RedisCluster`` client (it learns every node from that one, follows ``MOVED`` and ``ASK``,
and reloads the slot map after a failover), any other server a plain client. So any node of
a cluster will do as the URL, and a router starts while Redis is away (calls fail with
:class:`~tokenkeys.errors.Unavailable` until it is back).

Scripts run by ``EVALSHA``; a server that does not know one (a restart, a replica promoted
after a failover) gets it with ``SCRIPT LOAD`` (on every master of a cluster) and the call is
repeated. :meth:`RedisStore.batch` sends several script calls in one pipeline: on a cluster,
one round trip per node holding any of their keys, the nodes in parallel.

Redis errors are translated here, where they are caught: connection failures, timeouts and
cluster errors become :class:`~tokenkeys.errors.Unavailable` (a router then routes by load),
so does a full Redis (``maxmemory`` with ``noeviction`` refuses writes; see ``ingest.backoff``),
and keys of another type under the namespace :class:`~tokenkeys.errors.FailedPrecondition`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from tokenkeys.errors import ConfigError, FailedPrecondition, TokenkeysError, Unavailable

Client = aioredis.Redis | RedisCluster


@dataclass(frozen=True)
class Script:
    """A Lua script, named by its SHA-1 as ``EVALSHA`` wants it."""

    text: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class ScriptCall:
    """One script call of a :meth:`RedisStore.batch` (every key in one cluster slot)."""

    script: Script
    keys: Sequence[str]
    args: Sequence[Any]


class RedisStore:
    """A lazily connected client of a Redis server or cluster (see the module doc).

    ``client`` (tests, embedding) is used as given; otherwise :meth:`from_url` describes how to
    connect. ``label`` names the owner in error messages ("prefix index", "shared load").
    """

    def __init__(
        self,
        client: Client | None = None,
        *,
        url: str | None = None,
        options: dict[str, Any] | None = None,
        label: str = "prefix index",
        namespace: str = "",
        owns_client: bool = False,
    ) -> None:
        self._client = client
        self._url = url
        self._options = options or {}
        self._owns_client = owns_client or client is None
        self._connecting = asyncio.Lock()
        self.label = label
        self.namespace = namespace
        self.where = url_where(url) if url else client_where(client)

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = 1.0, retries: int = 1, **kwargs: Any
    ) -> RedisStore:
        """A store for the Redis or Redis Cluster node at ``url`` (``redis://``, ``rediss://``,
        ``unix://``; a cluster takes ``redis[s]://`` of any of its nodes).

        ``timeout`` bounds connecting and each reply, ``retries`` the reconnection attempts per
        call: a router must notice a dead Redis quickly and route by load instead (redis-py's
        own default retries 10 times with up to one second between tries).
        """
        try:
            aioredis.connection.parse_url(url)
        except ValueError as exc:
            raise ConfigError(
                f"Redis URL {url!r} is invalid: {exc}; expected redis://HOST:PORT[/DB], "
                "rediss://... or unix:///path",
                field="url",
            ) from exc
        options = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(ExponentialBackoff(cap=0.1, base=0.01), retries),
        }
        return cls(url=url, options=options, **kwargs)

    async def client(self) -> Client:
        """The connected client; the first call finds out whether ``url`` is a cluster."""
        if self._client is not None:
            return self._client
        async with self._connecting:
            if self._client is None:
                assert self._url is not None
                plain = aioredis.Redis.from_url(self._url, **self._options)
                try:
                    info = await self._guard("connect", plain.info("cluster"))
                except BaseException:
                    await plain.aclose()
                    raise
                if info.get("cluster_enabled"):
                    await plain.aclose()
                    self._client = await self._guard("connect", self._cluster())
                else:
                    self._client = plain
        return self._client

    async def _cluster(self) -> RedisCluster:
        assert self._url is not None
        options = dict(self._options)
        # A failover moves slots: more tries, each reloading the slot map, than a single
        # server needs (redis-py retries MOVED/ASK and connection errors on the new map).
        options["retry"] = Retry(ExponentialBackoff(cap=0.25, base=0.02), 6)
        cluster = RedisCluster.from_url(self._url, **options)
        await cluster.initialize()
        return cluster

    @property
    def is_cluster(self) -> bool:
        """Whether the connected client is a cluster's (False before the first call)."""
        return isinstance(self._client, RedisCluster)

    async def command(self, op: str, *args: Any) -> Any:
        """One Redis command (a cluster routes it by its key)."""
        client = await self.client()
        return await self._guard(op, client.execute_command(*args))

    async def set_once(self, op: str, key: str, value: str) -> str | None:
        """Set ``key`` to ``value`` unless it is set; the value it had (None: it had none)."""
        client = await self.client()
        old = await self._guard(op, client.set(key, value, nx=True, get=True))
        return old.decode() if isinstance(old, bytes) else old

    async def run(self, op: str, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """One script call."""
        return (await self.batch(op, [ScriptCall(script, keys, args)]))[0]

    async def batch(self, op: str, calls: Sequence[ScriptCall | tuple[Any, ...]]) -> list[Any]:
        """Several script calls (or plain commands, as tuples) in one pipeline: per cluster
        node, the nodes in parallel.

        Each call is atomic; calls of one batch must touch disjoint keys (their order is not
        kept across nodes), and be idempotent (a batch interrupted by a failover is sent again).
        """
        if not calls:
            return []
        client = await self.client()
        try:
            return await self._guard(op, self._pipeline(client, calls))
        except Unavailable as exc:
            if not isinstance(exc.__cause__, rexc.NoScriptError):
                raise
        # A server without the scripts (restarted, or a replica promoted by a failover): run
        # the batch again with the scripts' text (every script here is idempotent), and load
        # them for the next calls on every master the client knows now.
        for script in {call.script for call in calls if isinstance(call, ScriptCall)}:
            await self._guard(op, client.script_load(script.text))
        return await self._guard(op, self._pipeline(client, calls, by_text=True))

    @staticmethod
    async def _pipeline(
        client: Client, calls: Sequence[ScriptCall | tuple[Any, ...]], by_text: bool = False
    ) -> list[Any]:
        if isinstance(client, RedisCluster):
            pipe: Any = client.pipeline()
        else:
            pipe = client.pipeline(transaction=False)
        for call in calls:
            if isinstance(call, ScriptCall):
                script = call.script.text if by_text else call.script.sha
                command = "EVAL" if by_text else "EVALSHA"
                pipe.execute_command(command, script, len(call.keys), *call.keys, *call.args)
            else:
                pipe.execute_command(*call)
        # Raising on error lets a cluster pipeline retry what a failover interrupted: a
        # connection error or timeout reloads the slot map and sends the unanswered calls
        # again (redis-py retries only exceptions, not errors returned as results).
        return await pipe.execute(raise_on_error=True)

    async def _guard(self, op: str, awaitable: Any) -> Any:
        """Await one Redis operation, translating its errors into the tokenkeys tree."""
        try:
            return await awaitable
        except (rexc.RedisError, rexc.RedisClusterException) as exc:
            raise self._translate(op, exc) from exc

    def _translate(self, op: str, exc: Exception) -> TokenkeysError:
        what = f"{self.label} {op}"
        if isinstance(exc, rexc.ResponseError) and "WRONGTYPE" in str(exc):
            return FailedPrecondition(
                f"{what}: Redis namespace {{{self.namespace}}} at {self.where} holds keys of "
                f"another type ({exc}); choose a namespace no other program uses",
                field="namespace",
            )
        if isinstance(exc, rexc.OutOfMemoryError):  # maxmemory with noeviction: reads go on
            return Unavailable(
                f"{what}: Redis at {self.where} is full ({exc}); route by load until space "
                "returns: raise maxmemory or give the index a Redis of its own",
                backend="redis",
                op=op,
            )
        return Unavailable(
            f"{what}: Redis at {self.where} failed ({type(exc).__name__}: {exc}); route by "
            "load until it is back, and check the server",
            backend="redis",
            op=op,
        )

    async def close(self) -> None:
        """Close the client if this store created it (idempotent)."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            await client.aclose()
        elif client is not None:
            self._client = client


def url_where(url: str) -> str:
    """``host:port`` (or the socket path) of a Redis URL, for messages."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


def client_where(client: Client | None) -> str:
    """``host:port`` (or the socket path) a client was made for, for messages."""
    if isinstance(client, RedisCluster):
        node = client.get_default_node()
        return f"cluster via {node.host}:{node.port}" if node else "cluster"
    if client is None:
        return "?"
    kwargs = client.connection_pool.connection_kwargs
    return str(
        kwargs.get("path") or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    )
