"""The Redis prefix index: one index shared by several router replicas.

Layout, under a configurable namespace ``ns`` written as a Redis Cluster hash tag (``{ns}``, so
every key of one index lives in one slot and each script may name all of its keys):

- ``{ns}:b:<key>``: a HASH per block key (decimal u64); field = worker id, value = the tiers
  that worker holds the block in, sorted and comma-joined (``"cpu,gpu"``).
- ``{ns}:w:<worker>``: a SET of the block keys the worker holds, so :meth:`clear` touches only
  that worker's blocks (llm-d's Redis ``Clear`` scans the whole keyspace).
- ``{ns}:workers``: a SET of the workers holding anything.

Every update is one Lua script call, so it is atomic: other replicas see it whole or not at
all. Large updates are split into chunks of :data:`CHUNK` keys, each atomic. :meth:`lookup` is
a single script too: it walks the prompt's keys in order, asks each block only for the workers
still matching (``HMGET``) and stops when none is left, so one round trip answers it. (llm-d's
``RedisIndex.Lookup``, llm-d-router ``pkg/kvcache/kvblock/redis.go``, pipelines one ``HKEYS``
per key and stops at the first empty one.)

With ``ttl``, every write refreshes the expiry of the blocks it touches and of the worker's set:
entries of a worker whose events stop (a crash without notice) disappear after ``ttl`` seconds.

Redis errors are translated where they are caught: connection failures and timeouts become
:class:`~tokenkeys.errors.Unavailable` (a router then routes by load), and so does a full Redis
(``maxmemory`` with ``noeviction`` refuses writes; see ``ingest.backoff``), a namespace holding
foreign data :class:`~tokenkeys.errors.FailedPrecondition`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Collection, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from tokenkeys.errors import ConfigError, FailedPrecondition, TokenkeysError, Unavailable
from tokenkeys.router.index.model import (
    DEFAULT_TIER,
    PrefixMatch,
    check_filter,
    check_keys,
    check_tier,
    check_worker,
)

T = TypeVar("T")

#: Keys per script call: bounds how long one call holds Redis (a script blocks the server).
CHUNK = 2048
#: Longest worker filter sent to the lookup script (Lua's ``unpack`` stops near 8000 values);
#: a longer filter is applied to the answer instead, which gives the same result. (The same
#: limit bounds the workers holding one prompt's first block: thousands, far beyond a pool.)
MAX_SCRIPT_FILTER = 1024
_NAMESPACE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

# KEYS: workers set, the worker's key set, block hashes...; ARGV: worker, tier, ttl ms, ids...
_ADD = """
local worker, tier, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
for i = 3, #KEYS do
  local key = KEYS[i]
  local cur = redis.call('HGET', key, worker)
  if not cur then
    redis.call('HSET', key, worker, tier)
  elseif cur ~= tier then
    local list, found = {}, false
    for t in string.gmatch(cur, '[^,]+') do
      if t == tier then found = true end
      list[#list + 1] = t
    end
    if not found then
      list[#list + 1] = tier
      table.sort(list)
      redis.call('HSET', key, worker, table.concat(list, ','))
    end
  end
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
  redis.call('SADD', KEYS[2], ARGV[i + 1])
end
if ttl > 0 and #KEYS > 2 then redis.call('PEXPIRE', KEYS[2], ttl) end
redis.call('SADD', KEYS[1], worker)
return 0
"""

# KEYS: workers set, the worker's key set, block hashes...; ARGV: worker, tier, ids...
_REMOVE = """
local worker, tier = ARGV[1], ARGV[2]
for i = 3, #KEYS do
  local key = KEYS[i]
  local cur = redis.call('HGET', key, worker)
  if cur == tier then
    redis.call('HDEL', key, worker)
    redis.call('SREM', KEYS[2], ARGV[i])
  elseif cur then
    local list, found = {}, false
    for t in string.gmatch(cur, '[^,]+') do
      if t == tier then found = true else list[#list + 1] = t end
    end
    if found then redis.call('HSET', key, worker, table.concat(list, ',')) end
  end
end
if redis.call('SCARD', KEYS[2]) == 0 then redis.call('SREM', KEYS[1], worker) end
return 0
"""

# KEYS: workers set, the worker's key set, block hashes...; ARGV: worker, ids...
_CLEAR = """
local worker = ARGV[1]
for i = 3, #KEYS do
  redis.call('HDEL', KEYS[i], worker)
  redis.call('SREM', KEYS[2], ARGV[i - 1])
end
if redis.call('SCARD', KEYS[2]) == 0 then redis.call('SREM', KEYS[1], worker) end
return 0
"""

# KEYS: block hashes in prompt order; ARGV: the workers to consider (none: all).
# Returns {{worker, count, tiers, count, tiers, ...}, ...}: each worker's run, run-length encoded.
_LOOKUP = """
local runs, active = {}, {}
if #KEYS == 0 then return {} end
if #ARGV > 0 then
  local vals = redis.call('HMGET', KEYS[1], unpack(ARGV))
  for i = 1, #ARGV do
    if vals[i] then
      active[#active + 1] = ARGV[i]
      runs[ARGV[i]] = {1, vals[i]}
    end
  end
else
  local flat = redis.call('HGETALL', KEYS[1])
  for i = 1, #flat, 2 do
    active[#active + 1] = flat[i]
    runs[flat[i]] = {1, flat[i + 1]}
  end
end
for k = 2, #KEYS do
  if #active == 0 then break end
  local vals = redis.call('HMGET', KEYS[k], unpack(active))
  local still = {}
  for i = 1, #active do
    local v = vals[i]
    if v then
      local run = runs[active[i]]
      local n = #run
      if run[n] == v then run[n - 1] = run[n - 1] + 1 else run[n + 1] = 1; run[n + 2] = v end
      still[#still + 1] = active[i]
    end
  end
  active = still
end
local out = {}
for w, run in pairs(runs) do
  local item = {w}
  for j = 1, #run do item[j + 1] = run[j] end
  out[#out + 1] = item
end
return out
"""

# KEYS: workers set, then the key set of each worker in ARGV. Drops workers whose set expired.
_WORKERS = """
local out = {}
for i = 1, #ARGV do
  if redis.call('EXISTS', KEYS[i + 1]) == 1 then
    out[#out + 1] = ARGV[i]
  else
    redis.call('SREM', KEYS[1], ARGV[i])
  end
end
return out
"""


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


class RedisPrefixIndex:
    """A :class:`~tokenkeys.router.index.model.PrefixIndex` stored in Redis, shared by replicas.

    ``client`` is a ``redis.asyncio.Redis`` (responses as bytes or str); :meth:`from_url`
    builds one that fails fast when the server is away. ``namespace`` separates indexes in one
    Redis (one per pool); ``ttl`` (seconds) expires entries no event has refreshed.
    """

    #: Label of this backend in metrics.
    backend = "redis"

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        namespace: str = "tokenkeys",
        ttl: float | None = None,
        owns_client: bool = False,
    ) -> None:
        if not isinstance(namespace, str) or _NAMESPACE.fullmatch(namespace) is None:
            raise ConfigError(
                f"namespace {namespace!r:.80} is invalid; use 1-64 letters, digits or '_.:-' "
                "(it becomes the Redis Cluster hash tag {namespace})",
                field="namespace",
            )
        if ttl is not None and not (isinstance(ttl, (int, float)) and ttl > 0):
            raise ConfigError(
                f"ttl must be a positive number of seconds or None, got {ttl!r}", field="ttl"
            )
        self.namespace = namespace
        self.ttl = ttl
        self._ttl_ms = 0 if ttl is None else max(1, round(ttl * 1000))
        self._client = client
        self._owns_client = owns_client
        self._prefix = f"{{{namespace}}}:"
        self._workers_key = self._prefix + "workers"
        self._add = client.register_script(_ADD)
        self._remove = client.register_script(_REMOVE)
        self._clear = client.register_script(_CLEAR)
        self._lookup = client.register_script(_LOOKUP)
        self._alive = client.register_script(_WORKERS)
        kwargs = client.connection_pool.connection_kwargs
        self.where = str(
            kwargs.get("path") or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "tokenkeys",
        ttl: float | None = None,
        timeout: float = 1.0,
        retries: int = 1,
    ) -> RedisPrefixIndex:
        """An index on the Redis at ``url`` (``redis://host:port/db``, ``rediss://``, ``unix://``).

        ``timeout`` bounds connecting and each reply, ``retries`` the reconnection attempts per
        call: a router must notice a dead Redis quickly and route by load instead (redis-py's
        own default retries 10 times with up to one second between tries).
        """
        try:
            client = aioredis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(ExponentialBackoff(cap=0.1, base=0.01), retries),
            )
        except ValueError as exc:
            raise ConfigError(
                f"Redis URL {url!r} is invalid: {exc}; expected redis://HOST:PORT[/DB], "
                "rediss://... or unix:///path",
                field="url",
            ) from exc
        return cls(client, namespace=namespace, ttl=ttl, owns_client=True)

    def _block(self, key: int) -> str:
        return f"{self._prefix}b:{key}"

    def _worker_set(self, worker: str) -> str:
        return f"{self._prefix}w:{worker}"

    async def _call(self, op: str, awaitable: Awaitable[T]) -> T:
        """Await one Redis operation, translating its errors into the tokenkeys tree."""
        try:
            return await awaitable
        except rexc.RedisError as exc:
            raise self._translate(op, exc) from exc

    def _translate(self, op: str, exc: rexc.RedisError) -> TokenkeysError:
        if isinstance(exc, rexc.ResponseError) and "WRONGTYPE" in str(exc):
            return FailedPrecondition(
                f"prefix index {op}: Redis namespace {{{self.namespace}}} at {self.where} holds "
                f"keys of another type ({exc}); choose a namespace no other program uses",
                field="namespace",
            )
        if isinstance(exc, rexc.OutOfMemoryError):  # maxmemory with noeviction: reads go on
            return Unavailable(
                f"prefix index {op}: Redis at {self.where} is full ({exc}); route by load "
                "until space returns: raise maxmemory or give the index a Redis of its own",
                backend="redis",
                op=op,
            )
        return Unavailable(
            f"prefix index {op}: Redis at {self.where} failed ({type(exc).__name__}: {exc}); "
            "route by load until it is back, and check the server",
            backend="redis",
            op=op,
        )

    async def add(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Record that ``worker`` holds ``keys`` on ``tier`` (atomic per chunk of keys)."""
        check_worker(worker)
        check_tier(tier)
        check_keys(keys)
        head = [self._workers_key, self._worker_set(worker)]
        for start in range(0, len(keys), CHUNK):
            chunk = keys[start : start + CHUNK]
            await self._call(
                "add",
                self._add(
                    keys=head + [self._block(k) for k in chunk],
                    args=[worker, tier, self._ttl_ms, *chunk],
                ),
            )

    async def remove(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Record that ``worker`` dropped ``keys`` from ``tier`` (atomic per chunk of keys)."""
        check_worker(worker)
        check_tier(tier)
        check_keys(keys)
        head = [self._workers_key, self._worker_set(worker)]
        for start in range(0, len(keys), CHUNK):
            chunk = keys[start : start + CHUNK]
            await self._call(
                "remove",
                self._remove(
                    keys=head + [self._block(k) for k in chunk], args=[worker, tier, *chunk]
                ),
            )

    async def clear(self, worker: str) -> None:
        """Forget all of ``worker``'s blocks, a chunk at a time, then the worker itself."""
        check_worker(worker)
        head = [self._workers_key, self._worker_set(worker)]
        while True:
            ids = await self._call("clear", self._client.srandmember(head[1], CHUNK))
            ids = [int(i) for i in ids]
            await self._call(
                "clear",
                self._clear(keys=head + [self._block(k) for k in ids], args=[worker, *ids]),
            )
            if not ids:
                return

    async def lookup(
        self, keys: Sequence[int], workers: Collection[str] | None = None
    ) -> dict[str, PrefixMatch]:
        """Each worker's consecutive run over ``keys``, in one script call."""
        check_keys(keys)
        allowed = check_filter(workers)
        if not keys or allowed is not None and not allowed:
            return {}
        args = sorted(allowed) if allowed and len(allowed) <= MAX_SCRIPT_FILTER else []
        reply: list[Any] = await self._call(
            "lookup", self._lookup(keys=[self._block(k) for k in keys], args=args)
        )
        out: dict[str, PrefixMatch] = {}
        for item in reply:
            worker = _text(item[0])
            if allowed is not None and worker not in allowed:
                continue
            segments = tuple(
                (int(item[i]), tuple(_text(item[i + 1]).split(","))) for i in range(1, len(item), 2)
            )
            out[worker] = PrefixMatch(worker, segments)
        return out

    async def workers(self) -> frozenset[str]:
        """The workers holding at least one block (expired ones are pruned on the way)."""
        members = await self._call("workers", self._client.smembers(self._workers_key))
        names = sorted(_text(m) for m in members)
        if not names:
            return frozenset()
        alive = await self._call(
            "workers",
            self._alive(
                keys=[self._workers_key, *(self._worker_set(w) for w in names)], args=names
            ),
        )
        return frozenset(_text(w) for w in alive)

    async def close(self) -> None:
        """Close the client if this index created it (idempotent)."""
        if self._owns_client:
            await self._client.aclose()
