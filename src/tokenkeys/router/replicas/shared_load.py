"""What router replicas share: the requests each has in flight, and the cache growth it caused.

One router counts the requests it sent and has not seen answered (``load_view``): their blocks
in use, their prefill still queued, the new blocks it put into each worker's cache (the cost
model's growth). Replicas behind one load balancer each see only their share of a burst, so
two of them may send two new prefixes to one worker before any event or load poll shows it.
:class:`SharedLoad` is how they tell each other:

- :class:`LocalLoad` shares nothing (one router; today's behaviour).
- :class:`RedisSharedLoad` appends every decision's placement (the request it sends, the
  blocks it prefills, the growth it causes) and every flight's first output and end to one
  Redis stream of the namespace (``router.replicas.shared_stream``), and applies what the other
  replicas append to its own load views and growth ledgers, in the stream's order.

A decision is made on local memory, then placed (``router.policy.placement``): one atomic
round trip appends it unless a peer placed something since this replica last looked, in which
case the peer's entries come back, are applied, and the decision is made again (at most
``retries`` times, then placed as it stands). A burst routed by several replicas at once is
thereby decided as one router would decide it, one placement after the other.

A replica's own decisions do not queue one round trip each: those asked while one of its
placements is out are decided in order and placed together (``router.replicas.placement_groups``).
First outputs, ends and heartbeats are batched by a background task (one ``XADD`` per batch).

This follows Dynamo's router replica sync (ai-dynamo/dynamo ``lib/llm/src/kv_router/
sequence.rs``, ``--router-replica-sync``: each replica broadcasts its active-sequence events
to the others), over Redis instead of NATS, so a deployment that shares the index in Redis
needs nothing else; Dynamo's broadcast is after the fact, the placement here is agreed before
the request is sent. On a Redis Cluster any node serves as the URL (the stream lives on the
slot of its hash tag; the cluster client finds it).

A peer's flights are only as good as its entries (``router.replicas.peer_flights``). A replica that
stops appending (crashed, cut off) sends a heartbeat no more: after ``peer_timeout`` seconds
its flights are ended here.
When this replica loses the stream it ends every peer flight it holds and routes on its own
counts (local-only, as with :class:`LocalLoad`: decisions are not placed, a round trip to a
Redis that is away would only delay them) until it follows the stream again, from its newest
entry; entries of flights it never saw start are ignored.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import msgpack

from tokenkeys.errors import Unavailable
from tokenkeys.router.index.redis_store import RedisStore
from tokenkeys.router.policy.cost import GrowthLedger
from tokenkeys.router.policy.placement import Placement
from tokenkeys.router.replicas.peer_flights import PeerFlights
from tokenkeys.router.replicas.placement_groups import GroupPlacer
from tokenkeys.router.replicas.shared_stream import (
    ALIVE,
    ANSWERED,
    FINISHED,
    GREW,
    MAXLEN,
    PLACE,
    PLACED,
    READ_LIMIT,
    Cursor,
    stream_key,
)
from tokenkeys.router.workers.load_view import Flight
from tokenkeys.router.workers.pool import Pool

log = logging.getLogger(__name__)

Ledgers = Callable[[str], GrowthLedger]
T = TypeVar("T")


class SharedLoad(Protocol):
    """Tells other router replicas what this one sent; applies what they sent. It is also
    the policy's :class:`~tokenkeys.router.policy.placement.Placements`."""

    async def place(self, decide: Callable[[], tuple[Placement, T]]) -> T:
        """Agree on a decision with the other replicas (``router.policy.placement``)."""
        ...

    def sent(self, model: str, address: str, flight: Flight) -> None:
        """This router sent a request (its :class:`Flight`) to ``address`` of ``model``."""
        ...

    def answered(self, flight: Flight) -> None:
        """The request's first output arrived (its prefill is done)."""
        ...

    def finished(self, flight: Flight) -> None:
        """The request finished or failed."""
        ...

    async def start(self, pools: Mapping[str, Pool], ledgers: Ledgers) -> None:
        """Begin sharing: peers' flights go to ``pools``' load views, growth to ``ledgers``."""
        ...

    async def close(self) -> None:
        """Stop sharing (idempotent)."""
        ...


class LocalLoad:
    """Shares nothing: every router counts only its own requests."""

    async def place(self, decide: Callable[[], tuple[Placement, T]]) -> T:
        """The decision as made."""
        return decide()[1]

    def sent(self, model: str, address: str, flight: Flight) -> None:
        """Nothing to tell."""

    def answered(self, flight: Flight) -> None:
        """Nothing to tell."""

    def finished(self, flight: Flight) -> None:
        """Nothing to tell."""

    async def start(self, pools: Mapping[str, Pool], ledgers: Ledgers) -> None:
        """Nothing to follow."""

    async def close(self) -> None:
        """Nothing to close."""


#: Seconds a placement may wait for its request (``sent``) before it is ended for the peers
#: (its worker left the pool before the request went out).
_CLAIM_SECONDS = 2.0


class RedisSharedLoad:
    """:class:`SharedLoad` over a Redis stream (see the module doc).

    ``url``: any node of the Redis (or Redis Cluster) the replicas share; ``namespace``: the
    pool's (the stream is ``tokenkeys:{<namespace>:load}``); ``heartbeat`` seconds between
    this replica's signs of life; ``peer_timeout`` seconds of a peer's silence after which its
    flights are ended here; ``timeout`` bounds each Redis call; ``retries`` how often a
    decision is made again after peers' placements before it is placed as it stands.
    """

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "tokenkeys",
        heartbeat: float = 1.0,
        peer_timeout: float = 5.0,
        timeout: float = 1.0,
        retries: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.key = stream_key(namespace)
        self.replica = uuid.uuid4().hex
        self.heartbeat = heartbeat
        self.clock = clock
        self._timeout = timeout
        self._store = RedisStore.from_url(url, timeout=timeout, label="shared load")
        self._block_ms = max(int(1000 * min(heartbeat, timeout / 2)), 1)
        self._outbox: list[list[Any]] = []
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._serials: dict[int, int] = {}  # id(own flight) -> serial
        self._next = 0
        # Own placements not yet claimed by a request: (model, address, keys) -> (serial, when).
        self._placed: dict[tuple[str, str, tuple[int, ...]], list[tuple[int, float]]] = {}
        self._cursor = Cursor()
        # Peers' flights applied here (their timeout and clock are this replica's).
        self._peers = PeerFlights(self.member, self.ledger, timeout=peer_timeout, clock=clock)
        self._tasks: list[asyncio.Task[None]] = []
        self._pools: Mapping[str, Pool] = {}
        self._ledgers: Ledgers | None = None
        #: Changes not appended because Redis could not be reached (for /metrics, tests).
        self.dropped = 0
        #: Whether the stream is followed now (False: local-only).
        self.following = False
        self._placer = GroupPlacer(self, retries=retries)

    # ------------------------------------------------------------------ this replica's side

    def _post(self, item: list[Any]) -> None:
        self._outbox.append(item)
        self._wake.set()

    async def place(self, decide: Callable[[], tuple[Placement, T]]) -> T:
        """Decide, then place the decision on the stream (``router.replicas.placement_groups``)."""
        return await self._placer.place(decide)

    # The placer's view of the stream (``router.replicas.placement_groups.Stream``).

    def next_serial(self) -> int:
        """A new serial for one of this replica's flights."""
        self._next += 1
        return self._next

    async def append(self, placements: list[tuple[int, Placement]], force: bool) -> bool:
        """One ``PLACE`` round trip for ``placements``; the peers' entries it brings back are
        applied here. Raises Unavailable when Redis fails."""
        changes = [[PLACED, serial, *_fields(p)] for serial, p in placements]
        batch = msgpack.packb([self.replica, changes])
        args = [self._cursor.id, self.replica, batch, int(force), MAXLEN, READ_LIMIT]
        appended, news = await self._store.run("place", PLACE, [self.key], args)
        self._take(news)
        if appended and self._cursor.read < READ_LIMIT:  # nothing unread up to this entry
            self._cursor.advance(appended)
        return bool(appended)

    def claim(self, serial: int, placement: Placement) -> None:
        """The placement is agreed: its request, when sent, takes its serial."""
        self._placed.setdefault(_claim(placement), []).append((serial, self.clock()))

    def withdraw(self, serial: int, placement: Placement) -> None:
        """An agreed placement no request will take: unclaimed, and ended for the peers."""
        self._unclaim(_claim(placement), lambda claim: claim[0] == serial)

    def _unclaim(
        self, key: tuple[str, str, tuple[int, ...]], which: Callable[[tuple[int, float]], bool]
    ) -> int:
        """Drop the claims of ``key`` that ``which`` picks, ending each for the peers; how
        many were dropped."""
        claims = self._placed.get(key, [])
        gone = [c for c in claims if which(c)]
        for claim in gone:
            claims.remove(claim)
            self.ended(claim[0])
        if not claims:
            self._placed.pop(key, None)
        return len(gone)

    def ended(self, serial: int) -> None:
        """Tell the peers that ``serial`` ended."""
        self._post([FINISHED, serial])

    def grew(self, placement: Placement) -> None:
        """Tell the peers the growth of a decision that stands unplaced."""
        self._post([GREW, 0, placement.model, placement.worker, placement.growth])

    def member(self, model: str, address: str) -> Any:
        """The pool member at ``address`` of ``model``, or None."""
        pool = self._pools.get(model)
        return None if pool is None else pool.members.get(address)

    def ledger(self, model: str) -> GrowthLedger | None:
        """The growth ledger of ``model``'s pool (None before :meth:`start`)."""
        return None if self._ledgers is None or model not in self._pools else self._ledgers(model)

    @property
    def place_seconds(self) -> collections.deque[float]:
        """Seconds each placed decision took from being asked to agreed."""
        return self._placer.place_seconds

    @property
    def redecided(self) -> int:
        """Decisions made again after peers' placements."""
        return self._placer.redecided

    @property
    def forced(self) -> int:
        """Decisions placed as they stood after every retry."""
        return self._placer.forced

    def sent(self, model: str, address: str, flight: Flight) -> None:
        """The flight of a placed decision takes its placement's serial; any other (a retry
        on another worker, a decision not placed) is appended as placed now."""
        claims = self._placed.get((model, address, flight.keys))
        if claims:
            serial, _ = claims.pop(0)
            if not claims:
                del self._placed[(model, address, flight.keys)]
        else:
            serial = self.next_serial()
            self._post([PLACED, serial, model, address, list(flight.keys), list(flight.fresh), 0])
        self._serials[id(flight)] = serial

    def answered(self, flight: Flight) -> None:
        """Tell the end of the flight's prefill."""
        serial = self._serials.get(id(flight))
        if serial is not None:
            self._post([ANSWERED, serial])

    def finished(self, flight: Flight) -> None:
        """Tell the flight's end."""
        serial = self._serials.pop(id(flight), None)
        if serial is not None:
            self._post([FINISHED, serial])

    def _unclaimed(self) -> None:
        """End, here and for the peers, placements no request took up in time."""
        now = self.clock()
        for key in list(self._placed):
            expired = self._unclaim(key, lambda claim: now - claim[1] > _CLAIM_SECONDS)
            member = self.member(key[0], key[1]) if expired else None
            if member is not None:
                for _ in range(expired):  # their holds here go too
                    member.view.unhold(key[2])

    async def start(self, pools: Mapping[str, Pool], ledgers: Ledgers) -> None:
        """Start appending and following (in the background; Redis may be away)."""
        self._pools, self._ledgers = pools, ledgers
        self._tasks = [asyncio.create_task(self._publish()), asyncio.create_task(self._follow())]

    async def _publish(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.heartbeat)
            self._wake.clear()
            self._unclaimed()
            batch, self._outbox = self._outbox, []
            placing = int(any(change[0] == PLACED for change in batch))
            batch.append([ALIVE, 0])
            data = msgpack.packb([self.replica, batch])
            fields = ("r", self.replica, "p", placing, "d", data)  # the order PLACE reads
            command = ("XADD", self.key, "MAXLEN", "~", MAXLEN, "*", *fields)
            try:
                await self._store.command("publish", *command)
            except Unavailable as exc:
                self.dropped += len(batch) - 1
                log.debug("shared load: appending to %s failed: %s", self.url, exc.message)

    # ------------------------------------------------------------------------ peers' side

    async def _follow(self) -> None:
        delay = 0.05
        read = ("XREAD", "COUNT", READ_LIMIT, "BLOCK", self._block_ms, "STREAMS", self.key)
        while not self._stopping.is_set():
            try:
                newest = await self._store.command(
                    "follow", "XREVRANGE", self.key, "+", "-", "COUNT", 1
                )
                self._cursor.reset(newest[0][0] if newest else None)
                self.following, delay = True, 0.05
                while not self._stopping.is_set():
                    reply = await self._store.command("follow", *read, self._cursor.id)
                    for _, raw in reply or ():
                        self._take(raw)
                    self._peers.expire()
            except Unavailable as exc:
                log.warning(
                    "shared load: stream at %s lost, routing on own counts: %s",
                    self.url,
                    exc.message,
                )
            finally:
                self.following = False
                self._peers.end_all()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, 2.0)

    def _take(self, raw: Any) -> None:
        for replica, data in self._cursor.after(raw):
            if replica.decode() != self.replica:
                self.apply(msgpack.unpackb(data))

    def apply(self, message: list[Any]) -> None:
        """Apply one appended batch (``[replica, changes]``); this replica's own is skipped."""
        peer, changes = message
        if peer != self.replica:
            self._peers.apply(peer, changes)

    @property
    def peer_flights(self) -> int:
        """Peers' requests in flight applied here now."""
        return len(self._peers)

    async def close(self) -> None:
        """Stop appending and following; peers' flights are ended here."""
        # The tasks stop between two calls (a read blocks for at most ``_block_ms``): a task
        # cancelled inside redis-py's blocking read may never finish.
        self._stopping.set()
        self._wake.set()
        tasks, self._tasks = self._tasks, []
        timeout = 2 * self._timeout + self._block_ms / 1000
        await self._placer.close(timeout)  # its round trip ends within the call timeout
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
        await self._store.close()


def _fields(placement: Placement) -> list[Any]:
    p = placement
    return [p.model, p.worker, list(p.keys), list(p.fresh), float(p.growth)]


def _claim(placement: Placement) -> tuple[str, str, tuple[int, ...]]:
    return placement.model, placement.worker, placement.keys
