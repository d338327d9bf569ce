"""The Redis prefix index: one index shared by several router replicas, on Redis or a Cluster.

Layout, under a configurable namespace ``ns``, in ``shards`` shards. Each shard is a hash tag,
so all its keys live in one cluster slot and a script may name them all: ``{ns}`` when there
is one shard (a single Redis: the layout of earlier releases), ``{ns#0.k0}`` ...
``{ns#N-1.kN}`` otherwise (a cluster: :data:`CLUSTER_SHARDS` by default, their slots spread
evenly over the 16,384, :func:`shard_tags`). A block key ``k`` lives in shard ``k % shards``;
within a shard:

- ``<tag>:b:<key>``: a HASH per block key (decimal u64); field = worker id, value = the tiers
  that worker holds the block in, sorted and comma-joined (``"cpu,gpu"``).
- ``<tag>:w:<worker>``: a SET of the worker's block keys in this shard, so :meth:`clear`
  touches only that worker's blocks (llm-d's Redis ``Clear`` scans the whole keyspace).
- ``<tag>:workers``: a SET of the workers holding anything in this shard.

``{ns}:layout`` records the shard count (``SET NX``): every replica adopts what the first one
wrote, and one configured otherwise is refused. Writes are coalesced (``index.redis_writes``):
every ``add`` and ``remove`` made in one turn of the event loop (a router applies many engines'
event batches at once, one follower each) is queued, and the next turn sends them all as one
pipeline of ``WRITE`` script calls, one per shard touched (a new one past ``CHUNK`` keys), each
carrying its writes in the order they were made and atomic: other replicas see it whole or
not at all. Each node is sent its calls once. So a thousand engines' 32-block batches cost
about a dozen script calls, not a dozen per batch: before, ingest on a 3-master cluster here
was 6,000-10,000 blocks per second, round trips and the client's per-call work (each key
encoded and, on a cluster, hashed to check its slot) bounding it. The block keys go to the
script as comma-joined decimals, as for lookups. A caller's ``add`` returns when its turn's
pipeline has been answered (an error fails every write of the turn).

:meth:`lookup` on one shard is a single script (``WALK``): it walks the prompt's keys in order,
asks each block only for the workers still matching (``HMGET``), drops a worker at its first
miss and stops when none is left, so one round trip answers it. (llm-d's ``RedisIndex.Lookup``,
llm-d-router ``pkg/kvcache/kvblock/redis.go``, pipelines one ``HKEYS`` per key and stops at the
first empty one.) The block keys go to the script as one comma-joined argument, not one
argument each: encoding 8,192 arguments (and, on a cluster, hashing each to check its slot) was
most of a 128k-token lookup's client CPU. Sharded, a lookup takes two rounds: the first
block's holders (one call to one node), then one ``WALK`` per shard the rest of the prompt
touches with those holders, all in one pipeline (each node once, the nodes in parallel); each
returns every worker's run over its shard's keys, and a worker's run over the prompt ends at
the first position any shard's run stops short of (:func:`_join`). So a lookup costs two round
trips and at most ``shards`` script calls however long the prompt, with replies of a few
values per worker and shard.

With ``ttl``, every write refreshes the expiry of the blocks it touches and of the worker's set:
entries of a worker whose events stop (a crash without notice) disappear after ``ttl`` seconds.
Errors: see ``index.redis_store``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from tokenkeys.errors import ConfigError, FailedPrecondition
from tokenkeys.router.index import redis_scripts as lua
from tokenkeys.router.index.model import (
    DEFAULT_TIER,
    PrefixMatch,
    check_filter,
    check_keys,
    check_tier,
    check_worker,
)
from tokenkeys.router.index.redis_store import RedisStore, ScriptCall
from tokenkeys.router.index.redis_writes import CHUNK, TurnWrites, chunks

#: Longest worker list sent to one script (Lua's ``unpack`` stops near 8000 values); a longer
#: lookup filter is applied to the answer instead, which gives the same result. (The same
#: limit bounds the workers holding one prompt's first block: thousands, far beyond a pool.)
MAX_SCRIPT_FILTER = 1024
#: Shards of an index on a Redis Cluster when not configured. Each shard's tag is picked so
#: that its slot lies in the shard's equal part of the 16,384 slots (:func:`shard_tags`), so a
#: cluster whose masters own equal slot ranges gets equal shares: 12 divides evenly over 2, 3,
#: 4, 6 or 12 masters. More shards spread a larger cluster; each costs a script call on writes
#: and lookups that touch it (a 32-block event batch touches about 11 of 12).
CLUSTER_SHARDS = 12
MAX_SHARDS = 4096
SLOTS = 16384
_NAMESPACE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def shard_tags(namespace: str, shards: int) -> list[str]:
    """The hash tags of ``namespace``'s shards: ``ns#s.k``, the first ``k`` whose cluster slot
    (CRC16 % 16384, as Redis Cluster computes it) lies in shard ``s``'s equal part of the slots.

    Deterministic, so every replica derives the same layout; '#' cannot occur in a namespace,
    so no other namespace's tags collide."""
    tags = []
    for s in range(shards):
        low, high = s * SLOTS // shards, (s + 1) * SLOTS // shards
        k = 0
        while not low <= key_slot(f"{namespace}#{s}.{k}".encode()) < high:
            k += 1
        tags.append(f"{namespace}#{s}.{k}")
    return tags


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


#: A worker's run over keys: (count, comma-joined tiers) segments, run-length encoded.
Run = tuple[tuple[int, str], ...]


def _runs(reply: list[Any]) -> dict[str, Run]:
    """The runs of a :data:`~tokenkeys.router.index.redis_scripts.WALK` reply, by worker."""
    return {
        _text(item[0]): tuple((int(item[i]), _text(item[i + 1])) for i in range(1, len(item), 2))
        for item in reply
    }


def _join(size: int, first: str, pieces: Sequence[tuple[Sequence[int], Run]]) -> Run:
    """A worker's run over a prompt of ``size`` keys, from its tiers at key 0 and its runs over
    pieces of the rest (each piece: ascending prompt positions, the run over them).

    The run ends at the first position any piece's run stops short of; when one tier string
    covers everything, that is the answer, else the tiers are laid out per position."""
    end, seen = size, {first}
    for where, run in pieces:
        held = sum(count for count, _ in run)
        if held < len(where):
            end = min(end, where[held])
        seen.update(tiers for _, tiers in run)
    if len(seen) == 1:
        return ((end, first),)
    at = [first] + [""] * (end - 1)
    for where, run in pieces:
        j = 0
        for count, tiers in run:
            for i in where[j : j + count]:
                if i < end:
                    at[i] = tiers
            j += count
    out: list[list[Any]] = []
    for tiers in at:
        if out and out[-1][1] == tiers:
            out[-1][0] += 1
        else:
            out.append([1, tiers])
    return tuple((count, tiers) for count, tiers in out)


class RedisPrefixIndex:
    """A :class:`~tokenkeys.router.index.model.PrefixIndex` stored in Redis, shared by replicas.

    ``client`` is a ``redis.asyncio.Redis`` or ``RedisCluster`` (responses as bytes or str),
    or a :class:`RedisStore`; :meth:`from_url` builds one that fails fast when the server is
    away and finds out itself whether the URL names a cluster node. ``namespace`` separates
    indexes in one Redis (one per pool); ``ttl`` (seconds) expires entries no event has
    refreshed; ``shards`` fixes the shard count (default: 1 on a single Redis,
    :data:`CLUSTER_SHARDS` on a cluster, or whatever the namespace already records).
    """

    #: Label of this backend in metrics.
    backend = "redis"

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster | RedisStore,
        *,
        namespace: str = "tokenkeys",
        ttl: float | None = None,
        shards: int | None = None,
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
        if shards is not None and not (type(shards) is int and 1 <= shards <= MAX_SHARDS):
            raise ConfigError(
                f"shards must be an integer in [1, {MAX_SHARDS}] or None, got {shards!r}",
                field="shards",
            )
        self.namespace = namespace
        self.ttl = ttl
        self._ttl_ms = 0 if ttl is None else max(1, round(ttl * 1000))
        if isinstance(client, RedisStore):
            self._store = client
        else:
            self._store = RedisStore(client, owns_client=owns_client)
        self._store.namespace = namespace
        self.where = self._store.where
        self._wanted = shards
        self._prefixes: list[str] | None = None
        self._writes = TurnWrites(self._store, self._ttl_ms)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "tokenkeys",
        ttl: float | None = None,
        shards: int | None = None,
        timeout: float = 1.0,
        retries: int = 1,
    ) -> RedisPrefixIndex:
        """An index on the Redis at ``url`` (``redis://host:port/db``, ``rediss://``,
        ``unix://``), or on the Redis Cluster one of whose nodes it names.

        ``timeout`` bounds connecting and each reply, ``retries`` the reconnection attempts per
        call (see :meth:`RedisStore.from_url`).
        """
        store = RedisStore.from_url(url, timeout=timeout, retries=retries)
        return cls(store, namespace=namespace, ttl=ttl, shards=shards)

    @property
    def shards(self) -> int | None:
        """The shard count in use (None before the first call)."""
        return None if self._prefixes is None else len(self._prefixes)

    async def _layout(self) -> list[str]:
        """Each shard's key prefix, agreed with the namespace's ``layout`` record."""
        if self._prefixes is not None:
            return self._prefixes
        await self._store.client()
        wanted = self._wanted or (CLUSTER_SHARDS if self._store.is_cluster else 1)
        key = f"{{{self.namespace}}}:layout"
        text = await self._store.set_once("layout", key, f"shards={wanted}")
        shards = wanted
        if text is not None:
            recorded = int(text[7:]) if re.fullmatch(r"shards=[1-9][0-9]{0,3}", text) else None
            if recorded is None or self._wanted is not None and recorded != wanted:
                raise FailedPrecondition(
                    f"prefix index: Redis namespace {{{self.namespace}}} at {self.where} is "
                    f"laid out as {text!r:.40}, this router asks for shards={wanted}; give "
                    "every replica the same shard count (or none, to adopt the recorded one)",
                    field="shards",
                )
            shards = recorded
        if shards == 1:
            self._prefixes = [f"{{{self.namespace}}}:"]
        else:
            self._prefixes = [f"{{{tag}}}:" for tag in shard_tags(self.namespace, shards)]
        return self._prefixes

    async def add(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Record that ``worker`` holds ``keys`` on ``tier`` (atomic per shard and chunk)."""
        await self._write("a", worker, keys, tier)

    async def remove(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Record that ``worker`` dropped ``keys`` from ``tier`` (atomic per shard and chunk)."""
        await self._write("r", worker, keys, tier)

    async def _write(self, op: str, worker: str, keys: Sequence[int], tier: str) -> None:
        """Check the arguments, then queue the write for this turn's pipeline and wait for
        it (``index.redis_writes``)."""
        check_worker(worker)
        check_tier(tier)
        check_keys(keys)
        prefixes = await self._layout()
        if keys:
            await self._writes.write(prefixes, op, worker, tier, keys)

    async def clear(self, worker: str) -> None:
        """Forget all of ``worker``'s blocks, a chunk per shard at a time, then the worker."""
        check_worker(worker)
        prefixes = await self._layout()
        live = list(prefixes)
        while live:
            sets = [(p, f"{p}w:{worker}") for p in live]
            picks = await self._store.batch(
                "clear", [("SRANDMEMBER", key, CHUNK) for _, key in sets]
            )
            calls = []
            for (p, key), ids in zip(sets, picks, strict=True):
                ids = [int(i) for i in ids]
                keys = [p + "workers", key, *(f"{p}b:{k}" for k in ids)]
                calls.append(ScriptCall(lua.CLEAR, keys, [worker, *ids]))
            await self._store.batch("clear", calls)
            live = [p for (p, _), ids in zip(sets, picks, strict=True) if ids]

    async def lookup(
        self, keys: Sequence[int], workers: Collection[str] | None = None
    ) -> dict[str, PrefixMatch]:
        """Each worker's consecutive run over ``keys`` (one script call on one shard)."""
        check_keys(keys)
        allowed = check_filter(workers)
        if not keys or allowed is not None and not allowed:
            return {}
        prefixes = await self._layout()
        args = sorted(allowed) if allowed and len(allowed) <= MAX_SCRIPT_FILTER else []
        if len(prefixes) == 1:
            p = prefixes[0]
            call = [p + "workers"], [p + "b:", ",".join(map(str, keys)), *args]
            runs = _runs(await self._store.run("lookup", lua.WALK, *call))
        else:
            runs = await self._sharded_lookup(prefixes, keys, args)
        out: dict[str, PrefixMatch] = {}
        for worker, run in runs.items():
            if allowed is None or worker in allowed:
                segments = tuple((count, tuple(tiers.split(","))) for count, tiers in run)
                out[worker] = PrefixMatch(worker, segments)
        return out

    async def _sharded_lookup(
        self, prefixes: list[str], keys: Sequence[int], args: list[str]
    ) -> dict[str, Run]:
        n = len(prefixes)
        first = f"{prefixes[keys[0] % n]}b:{keys[0]}"
        if args:
            values = await self._store.command("lookup", "HMGET", first, *args)
            held = {w: _text(v) for w, v in zip(args, values, strict=True) if v is not None}
        else:
            flat = await self._store.command("lookup", "HGETALL", first)
            held = {_text(w): _text(v) for w, v in flat.items()}
        if not held:
            return {}
        names = sorted(held)
        positions: dict[int, list[int]] = {}
        for i in range(1, len(keys)):
            positions.setdefault(keys[i] % n, []).append(i)
        calls, pieces = [], []
        for shard, where in positions.items():
            p = prefixes[shard]
            for chunk in chunks(where, CHUNK):
                ids = ",".join([str(keys[i]) for i in chunk])
                for start in range(0, len(names), MAX_SCRIPT_FILTER):
                    group = names[start : start + MAX_SCRIPT_FILTER]
                    calls.append(ScriptCall(lua.WALK, [p + "workers"], [p + "b:", ids, *group]))
                    pieces.append((chunk, group))
        replies = await self._store.batch("lookup", calls)
        # Each worker's runs over the pieces of the prompt (a shard's chunk) its group covers.
        parts: dict[str, list[tuple[list[int], Run]]] = {w: [] for w in names}
        for (chunk, group), reply in zip(pieces, replies, strict=True):
            found = _runs(reply)
            for worker in group:
                parts[worker].append((chunk, found.get(worker, ())))
        return {w: _join(len(keys), held[w], parts[w]) for w in names}

    async def workers(self) -> frozenset[str]:
        """The workers holding at least one block (expired ones are pruned on the way)."""
        prefixes = await self._layout()
        members = await self._store.batch(
            "workers", [("SMEMBERS", p + "workers") for p in prefixes]
        )
        calls = []
        for p, found in zip(prefixes, members, strict=True):
            names = sorted(_text(m) for m in found)
            if names:
                keys = [p + "workers", *(f"{p}w:{w}" for w in names)]
                calls.append(ScriptCall(lua.WORKERS, keys, names))
        alive = await self._store.batch("workers", calls)
        return frozenset(_text(w) for answer in alive for w in answer)

    async def close(self) -> None:
        """Finish the writes queued, then close the client if this index created it
        (idempotent)."""
        await self._writes.drain()
        await self._store.close()
