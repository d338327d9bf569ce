"""The Redis prefix index's writes: every ``add`` and ``remove`` of one event-loop turn, in one
pipeline (the layout and the ``WRITE`` script: ``index.redis``, ``index.redis_scripts``).

A router applies many engines' event batches at once (one follower task each), so the writes
of one turn are queued and the next turn sends them together: per shard, ``WRITE`` calls of at
most :data:`CHUNK` keys carrying the writes in the order they were made, one pipeline for all
(each node sent its calls once). A writer waits for its turn's pipeline; an error fails every
write of the turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenkeys.router.index import redis_scripts as lua
from tokenkeys.router.index.redis_store import RedisStore, ScriptCall

#: Keys per script call: bounds how long one call holds Redis (a script blocks the server).
CHUNK = 2048

#: One write: op (``a`` add, ``r`` remove), worker, tier, block keys.
Write = tuple[str, str, str, Sequence[int]]


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """``items`` in consecutive pieces of at most ``size``."""
    return [items[i : i + size] for i in range(0, len(items), size)]


@dataclass
class _Flush:
    """The writes queued in one turn of the event loop, and their common outcome."""

    done: asyncio.Future[None]
    ops: list[Write] = field(default_factory=list)


def write_calls(prefixes: list[str], ttl_ms: int, ops: Sequence[Write]) -> list[ScriptCall]:
    """``WRITE`` calls for ``ops`` (op, worker, tier, keys), in order: per shard, groups of
    one op's keys in that shard, a new call whenever a call reaches :data:`CHUNK` keys."""
    n = len(prefixes)
    calls: list[ScriptCall] = []
    open_: dict[int, tuple[list[Any], list[int]]] = {}  # shard -> (args, [keys in it])

    def group(shard: int, op: str, worker: str, tier: str, keys: Sequence[int]) -> None:
        for chunk in chunks(keys, CHUNK):
            args, size = open_.get(shard, (None, [0]))
            if args is None or size[0] + len(chunk) > CHUNK:
                p = prefixes[shard]
                args, size = [p, ttl_ms], [0]
                open_[shard] = (args, size)
                calls.append(ScriptCall(lua.WRITE, [p + "workers"], args))
            args += [op, worker, tier, ",".join(map(str, chunk))]
            size[0] += len(chunk)

    for op, worker, tier, keys in ops:
        if n == 1:
            group(0, op, worker, tier, keys)
            continue
        by_shard: dict[int, list[int]] = {}
        for key in keys:
            by_shard.setdefault(key % n, []).append(key)
        for shard, shard_keys in by_shard.items():
            group(shard, op, worker, tier, shard_keys)
    return calls


class TurnWrites:
    """Queues the writes of each event-loop turn and sends them as one pipeline."""

    def __init__(self, store: RedisStore, ttl_ms: int) -> None:
        self._store = store
        self._ttl_ms = ttl_ms
        self._flush: _Flush | None = None
        self._prefixes: list[str] = []
        self._flushing: set[asyncio.Future[None]] = set()

    async def write(
        self, prefixes: list[str], op: str, worker: str, tier: str, keys: Sequence[int]
    ) -> None:
        """Queue one write for this turn's pipeline and wait for that pipeline's answer."""
        flush = self._flush
        if flush is None:
            loop = asyncio.get_running_loop()
            flush = self._flush = _Flush(loop.create_future())
            self._prefixes = prefixes
            loop.call_soon(self._start)
        flush.ops.append((op, worker, tier, keys))
        await asyncio.shield(flush.done)

    def _start(self) -> None:
        flush, self._flush = self._flush, None
        if flush is not None:
            task = asyncio.ensure_future(self._send(flush))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _send(self, flush: _Flush) -> None:
        calls = write_calls(self._prefixes, self._ttl_ms, flush.ops)
        try:
            await self._store.batch("write", calls)
        except BaseException as exc:
            if not flush.done.done():
                flush.done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            flush.done.set_result(None)
        # Nobody may be waiting (every writer cancelled): the error is theirs, not the loop's.
        if flush.done.done() and not flush.done.cancelled():
            flush.done.exception()

    async def drain(self) -> None:
        """Send what is queued and wait for every pipeline out."""
        self._start()
        if self._flushing:
            await asyncio.wait(list(self._flushing))
