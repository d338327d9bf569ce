"""What router replicas share: the requests each has in flight, and the cache growth it caused.

One router counts the requests it sent and has not seen answered (``load_view``): their blocks
in use, their prefill still queued, the new blocks it put into each worker's cache (the cost
model's growth). Replicas behind one load balancer each see only their share of a burst, so
two of them may send two new prefixes to one worker before any event or load poll shows it.
:class:`SharedLoad` is how they tell each other:

- :class:`LocalLoad` shares nothing (one router; today's behaviour).
- :class:`RedisSharedLoad` publishes every flight's start, first output and end, and every
  growth a decision records, on a Redis pub/sub channel of the namespace, and applies what the
  other replicas publish to its own load views and growth ledgers. So a routing decision
  reads only local memory, as before: sharing costs it nothing but one append to an outbox,
  which a background task publishes (one ``PUBLISH`` per batch of changes).

This follows Dynamo's router replica sync (ai-dynamo/dynamo ``lib/llm/src/kv_router/
sequence.rs``, ``--router-replica-sync``: each replica broadcasts its active-sequence events
to the others), over Redis instead of NATS, so a deployment that shares the index in Redis
needs nothing else. On a Redis Cluster any node serves: classic pub/sub messages reach every
node.

A peer's flights are only as good as its messages. A replica that stops publishing (crashed,
cut off) sends a heartbeat no more: after ``peer_timeout`` seconds its flights are ended here.
When this replica loses the channel it ends every peer flight it holds and routes on its own
counts (local-only, as with :class:`LocalLoad`) until the subscription is back; messages of
flights it never saw start are ignored.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgpack
import redis.asyncio as aioredis
import redis.exceptions as rexc

from tokenkeys.router.policy.cost import GrowthLedger
from tokenkeys.router.policy.precise import GrowthLedgers
from tokenkeys.router.workers.load_view import Flight
from tokenkeys.router.workers.pool import Pool

log = logging.getLogger(__name__)

Ledgers = Callable[[str], GrowthLedger]


class SharedLoad(Protocol):
    """Tells other router replicas what this one sent; applies what they sent."""

    def sent(self, model: str, address: str, flight: Flight) -> None:
        """This router sent a request (its :class:`Flight`) to ``address`` of ``model``."""
        ...

    def answered(self, flight: Flight) -> None:
        """The request's first output arrived (its prefill is done)."""
        ...

    def finished(self, flight: Flight) -> None:
        """The request finished or failed."""
        ...

    def grew(self, model: str, address: str, blocks: float) -> None:
        """A routing decision put ``blocks`` new blocks into the worker's cache."""
        ...

    async def start(self, pools: Mapping[str, Pool], ledgers: Ledgers) -> None:
        """Begin sharing: peers' flights go to ``pools``' load views, growth to ``ledgers``."""
        ...

    async def close(self) -> None:
        """Stop sharing (idempotent)."""
        ...


class LocalLoad:
    """Shares nothing: every router counts only its own requests."""

    def sent(self, model: str, address: str, flight: Flight) -> None:
        """Nothing to tell."""

    def answered(self, flight: Flight) -> None:
        """Nothing to tell."""

    def finished(self, flight: Flight) -> None:
        """Nothing to tell."""

    def grew(self, model: str, address: str, blocks: float) -> None:
        """Nothing to tell."""

    async def start(self, pools: Mapping[str, Pool], ledgers: Ledgers) -> None:
        """Nothing to follow."""

    async def close(self) -> None:
        """Nothing to close."""


class SharedGrowth(GrowthLedgers):
    """Growth ledgers whose every record (a decision of this router) is also told to the
    other replicas through ``shared``; their records go straight to :meth:`ledger`."""

    def __init__(self, shared: SharedLoad) -> None:
        super().__init__()
        self.shared = shared

    def record(self, model: str, worker: str, new_blocks: float) -> None:
        """Record this router's decision and publish it."""
        super().record(model, worker, new_blocks)
        self.shared.grew(model, worker, new_blocks)


# Message kinds: [kind, serial, model, address, keys, fresh] / [kind, serial] / growth.
_SENT, _ANSWERED, _FINISHED, _GREW, _ALIVE = range(5)


class RedisSharedLoad:
    """:class:`SharedLoad` over a Redis pub/sub channel (see the module doc).

    ``url``: any node of the Redis (or Redis Cluster) the replicas share; ``namespace``: the
    pool's (the channel is ``tokenkeys:<namespace>:load``); ``heartbeat`` seconds between
    this replica's signs of life; ``peer_timeout`` seconds of a peer's silence after which its
    flights are ended here.
    """

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "tokenkeys",
        heartbeat: float = 1.0,
        peer_timeout: float = 5.0,
        timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.channel = f"tokenkeys:{namespace}:load"
        self.replica = uuid.uuid4().hex
        self.heartbeat = heartbeat
        self.peer_timeout = peer_timeout
        self.clock = clock
        self._timeout = timeout
        self._outbox: list[list[Any]] = []
        self._wake = asyncio.Event()
        self._serials: dict[int, int] = {}  # id(own flight) -> serial
        self._next = 0
        # Peers' flights applied here: (peer, serial) -> (view's flight, the view's owner).
        self._peer_flights: dict[tuple[str, int], tuple[Flight, Any]] = {}
        self._seen: dict[str, float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._pools: Mapping[str, Pool] = {}
        self._ledgers: Ledgers | None = None
        #: Changes not published because Redis could not be reached (for /metrics, tests).
        self.dropped = 0
        #: Whether the channel is followed now (False: local-only).
        self.following = False

    # ------------------------------------------------------------------ this replica's side

    def _post(self, item: list[Any]) -> None:
        self._outbox.append(item)
        self._wake.set()

    def sent(self, model: str, address: str, flight: Flight) -> None:
        """Publish the flight's start (keys, and the blocks it prefills there)."""
        self._next += 1
        self._serials[id(flight)] = self._next
        self._post([_SENT, self._next, model, address, list(flight.keys), list(flight.fresh)])

    def answered(self, flight: Flight) -> None:
        """Publish the end of the flight's prefill."""
        serial = self._serials.get(id(flight))
        if serial is not None:
            self._post([_ANSWERED, serial])

    def finished(self, flight: Flight) -> None:
        """Publish the flight's end."""
        serial = self._serials.pop(id(flight), None)
        if serial is not None:
            self._post([_FINISHED, serial])

    def grew(self, model: str, address: str, blocks: float) -> None:
        """Publish a decision's cache growth."""
        self._post([_GREW, 0, model, address, float(blocks)])

    async def start(self, pools: Mapping[str, Pool], ledgers: Ledgers) -> None:
        """Start publishing and following (in the background; Redis may be away)."""
        self._pools, self._ledgers = pools, ledgers
        self._tasks = [asyncio.create_task(self._publish()), asyncio.create_task(self._follow())]

    def _client(self) -> aioredis.Redis:
        t = self._timeout
        return aioredis.Redis.from_url(self.url, socket_timeout=t, socket_connect_timeout=t)

    async def _publish(self) -> None:
        client = self._client()
        try:
            while True:
                try:
                    await asyncio.wait_for(self._wake.wait(), self.heartbeat)
                except asyncio.TimeoutError:
                    pass
                self._wake.clear()
                batch, self._outbox = self._outbox, []
                batch.append([_ALIVE, 0])
                try:
                    await client.publish(self.channel, msgpack.packb([self.replica, batch]))
                except (rexc.RedisError, OSError) as exc:
                    self.dropped += len(batch) - 1
                    log.debug("shared load: publish to %s failed: %s", self.url, exc)
        finally:
            await client.aclose()

    # ------------------------------------------------------------------------ peers' side

    async def _follow(self) -> None:
        delay = 0.05
        while True:
            client = self._client()
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                self.following, delay = True, 0.05
                while True:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=self.heartbeat
                    )
                    if message is not None and message["type"] == "message":
                        self.apply(msgpack.unpackb(message["data"]))
                    self._expire()
            except (rexc.RedisError, OSError) as exc:
                log.warning(
                    "shared load: channel at %s lost, routing on own counts: %s", self.url, exc
                )
            finally:
                self.following = False
                self._end_peers(lambda peer: True)
                await pubsub.aclose()
                await client.aclose()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def apply(self, message: list[Any]) -> None:
        """Apply one published batch (``[replica, changes]``); this replica's own is skipped."""
        peer, changes = message
        if peer == self.replica:
            return
        self._seen[peer] = self.clock()
        for change in changes:
            kind, serial = change[0], change[1]
            if kind == _SENT:
                model, address, keys, fresh = change[2:6]
                member = self._member(model, address)
                if member is not None:
                    flight = member.view.adopt(keys, fresh)
                    self._peer_flights[(peer, serial)] = (flight, member.view)
            elif kind == _ANSWERED:
                held = self._peer_flights.get((peer, serial))
                if held is not None:
                    held[1].first_output(held[0])
            elif kind == _FINISHED:
                held = self._peer_flights.pop((peer, serial), None)
                if held is not None:
                    held[1].end(held[0])
            elif kind == _GREW and self._ledgers is not None:
                model, address, blocks = change[2:5]
                if model in self._pools:
                    self._ledgers(model).record(address, blocks)

    def _member(self, model: str, address: str) -> Any:
        pool = self._pools.get(model)
        return None if pool is None else pool.members.get(address)

    def _expire(self) -> None:
        now = self.clock()
        gone = {p for p, seen in self._seen.items() if now - seen > self.peer_timeout}
        if gone:
            self._end_peers(gone.__contains__)
            for peer in gone:
                del self._seen[peer]

    def _end_peers(self, which: Callable[[str], bool]) -> None:
        for key in [k for k in self._peer_flights if which(k[0])]:
            flight, view = self._peer_flights.pop(key)
            view.end(flight)

    @property
    def peer_flights(self) -> int:
        """Peers' requests in flight applied here now."""
        return len(self._peer_flights)

    async def close(self) -> None:
        """Stop publishing and following; peers' flights are ended here."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: PERF203
                pass
