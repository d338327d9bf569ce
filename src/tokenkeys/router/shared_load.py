"""What router replicas share: the requests each has in flight, and the cache growth it caused.

One router counts the requests it sent and has not seen answered (``load_view``): their blocks
in use, their prefill still queued, the new blocks it put into each worker's cache (the cost
model's growth). Replicas behind one load balancer each see only their share of a burst, so
two of them may send two new prefixes to one worker before any event or load poll shows it.
:class:`SharedLoad` is how they tell each other:

- :class:`LocalLoad` shares nothing (one router; today's behaviour).
- :class:`RedisSharedLoad` appends every decision's placement (the request it sends, the
  blocks it prefills, the growth it causes) and every flight's first output and end to one
  Redis stream of the namespace (``router.shared_stream``), and applies what the other
  replicas append to its own load views and growth ledgers, in the stream's order.

A decision is made on local memory, then placed (``router.policy.placement``): one atomic
round trip appends it unless a peer placed something since this replica last looked, in which
case the peer's entries come back, are applied, and the decision is made again (at most
``retries`` times, then placed as it stands). A burst routed by several replicas at once is
thereby decided as one router would decide it, one placement after the other.

A replica's own decisions do not queue one round trip each. The decisions it is asked while a
placement is out form the next group: decided in order, each held in this replica's load view
and growth ledger (``LoadView.hold``, ``GrowthLedger.hold``) so that the next one sees it as one
router sees its previous decision, and placed in one round trip (one stream entry); a refused
group is decided again as a whole on the peers' entries. An agreed placement's growth goes to
the policy, which records it, and its flight stays held until its request goes out
(``LoadView.begin`` takes it over) or is withdrawn when none does in time; a caller that
leaves (cancelled) has its placement withdrawn, and ended for the peers. A burst of N
decisions thus costs a replica about two round trips, not N. First outputs, ends and
heartbeats are batched by a background task (one ``XADD`` per batch). What placing cost each
decision, from being asked to agreed, is kept in :attr:`RedisSharedLoad.place_seconds`
(bench_routing prints it).

This follows Dynamo's router replica sync (ai-dynamo/dynamo ``lib/llm/src/kv_router/
sequence.rs``, ``--router-replica-sync``: each replica broadcasts its active-sequence events
to the others), over Redis instead of NATS, so a deployment that shares the index in Redis
needs nothing else; Dynamo's broadcast is after the fact, the placement here is agreed before
the request is sent. On a Redis Cluster any node serves as the URL (the stream lives on the
slot of its hash tag; the cluster client finds it).

A peer's flights are only as good as its entries. A replica that stops appending (crashed,
cut off) sends a heartbeat no more: after ``peer_timeout`` seconds its flights are ended here.
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
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import msgpack

from tokenkeys.errors import Unavailable
from tokenkeys.router.index.redis_store import RedisStore
from tokenkeys.router.policy.cost import GrowthLedger
from tokenkeys.router.policy.placement import Placement
from tokenkeys.router.shared_stream import (
    MAXLEN,
    PLACE,
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


# Change kinds: [kind, serial, model, address, keys, fresh, growth] / [kind, serial] /
# growth alone (a decision not placed: local-only) / a sign of life.
_PLACED, _ANSWERED, _FINISHED, _GREW, _ALIVE = range(5)
#: Seconds a placement may wait for its request (``sent``) before it is ended for the peers
#: (its worker left the pool before the request went out).
_CLAIM_SECONDS = 2.0
# Where an ask is: waiting for a group, in a group's round trip, placed (held here until its
# request goes out), or done with here (decided locally, failed, or withdrawn).
_QUEUED, _PLACING, _PLACED_HERE, _LOCAL = range(4)


@dataclass(eq=False)
class _Ask:
    """One decision asked of :meth:`RedisSharedLoad.place` and what became of it."""

    decide: Callable[[], tuple[Placement, Any]]
    done: asyncio.Future[Any]
    queued: float
    state: int = _QUEUED
    placement: Placement = field(init=False)
    result: Any = None
    serial: int = 0
    held: bool = False
    growth_released: bool = False
    abandoned: bool = False


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
        self.peer_timeout = peer_timeout
        self.retries = retries
        self.clock = clock
        self._timeout = timeout
        self._store = RedisStore.from_url(url, timeout=timeout, label="shared load")
        self._block_ms = max(int(1000 * min(heartbeat, timeout / 2)), 1)
        self._outbox: list[list[Any]] = []
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._asks: list[_Ask] = []
        self._placer: asyncio.Task[None] | None = None
        self._serials: dict[int, int] = {}  # id(own flight) -> serial
        self._next = 0
        # Own placements not yet claimed by a request: (model, address, keys) -> (serial, when).
        self._placed: dict[tuple[str, str, tuple[int, ...]], list[tuple[int, float]]] = {}
        self._cursor = Cursor()
        # Peers' flights applied here: (peer, serial) -> (view's flight, the view's owner).
        self._peer_flights: dict[tuple[str, int], tuple[Flight, Any]] = {}
        self._seen: dict[str, float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._pools: Mapping[str, Pool] = {}
        self._ledgers: Ledgers | None = None
        #: Changes not appended because Redis could not be reached (for /metrics, tests).
        self.dropped = 0
        #: Whether the stream is followed now (False: local-only).
        self.following = False
        #: Seconds each placed decision spent agreeing (round trips and decisions made again).
        self.place_seconds: collections.deque[float] = collections.deque(maxlen=100_000)
        #: Decisions made again after peers' placements, and placed as they stood at the end.
        self.redecided = 0
        self.forced = 0

    # ------------------------------------------------------------------ this replica's side

    def _post(self, item: list[Any]) -> None:
        self._outbox.append(item)
        self._wake.set()

    async def place(self, decide: Callable[[], tuple[Placement, T]]) -> T:
        """Decide, then place the decision on the stream with the others asked meanwhile
        (module doc); local-only while the stream is not followed or Redis fails."""
        if not self.following:
            placement, result = decide()
            self._post([_GREW, 0, placement.model, placement.worker, placement.growth])
            return result
        ask = _Ask(decide, asyncio.get_running_loop().create_future(), time.perf_counter())
        self._asks.append(ask)
        if self._placer is None or self._placer.done():
            self._placer = asyncio.create_task(self._place_asks())
        try:
            result = await ask.done
        except asyncio.CancelledError:
            self._abandon(ask)
            raise
        if ask.held:  # agreed: its growth is the caller's to record now; its flight stays held
            self._unhold(ask, flight=False)
        return result

    async def _place_asks(self) -> None:
        """Place what was asked, one group per round trip, until nothing is asked."""
        while self._asks and not self._stopping.is_set():
            group, self._asks = self._asks, []
            for ask in group:
                ask.state = _PLACING
            try:
                await self._place_group(group)
            except BaseException:
                for ask in group:
                    self._give_up(ask, Unavailable("shared load: closed while placing"))
                raise

    async def _place_group(self, group: list[_Ask]) -> None:
        """Decide every ask of ``group`` in order, each seeing the ones before it (held), and
        place them in one round trip; again on the peers' placements when one came between."""
        for attempt in range(self.retries + 1):
            group = [ask for ask in group if self._decide(ask)]
            if not group:
                return
            if not self.following:
                break
            force = attempt == self.retries
            batch = msgpack.packb(
                [self.replica, [[_PLACED, a.serial, *_fields(a.placement)] for a in group]]
            )
            args = [self._cursor.id, self.replica, batch, int(force), MAXLEN, READ_LIMIT]
            try:
                appended, news = await self._store.run("place", PLACE, [self.key], args)
            except Unavailable as exc:
                log.debug("shared load: placing on %s failed: %s", self.url, exc.message)
                break
            self._take(news)
            if appended:
                if self._cursor.read < READ_LIMIT:  # nothing unread up to this entry
                    self._cursor.advance(appended)
                now = time.perf_counter()
                for ask in group:
                    self._placed.setdefault(_claim(ask.placement), []).append(
                        (ask.serial, self.clock())
                    )
                    ask.state = _PLACED_HERE
                    self.place_seconds.append(now - ask.queued)
                    if ask.abandoned:
                        self._abandon(ask)
                    else:
                        ask.done.set_result(ask.result)
                self.forced += force * len(group)
                return
            self.redecided += len(group)
            for ask in group:
                self._unhold(ask, flight=True)
        # Not placed: the decisions stand locally, their growth told after the fact (and
        # their placements ended for the peers, in case the script ran and its reply was lost).
        for ask in group:
            self._unhold(ask, flight=True)
            ask.state = _LOCAL
            if self.following:
                self._post([_FINISHED, ask.serial])
            if not ask.abandoned:
                p = ask.placement
                self._post([_GREW, 0, p.model, p.worker, p.growth])
                ask.done.set_result(ask.result)

    def _decide(self, ask: _Ask) -> bool:
        """Make the ask's decision and hold it here; False when it is gone (abandoned, or the
        decision failed: the error is its caller's)."""
        if ask.abandoned:
            return False
        try:
            ask.placement, ask.result = ask.decide()
        except Exception as exc:
            ask.state = _LOCAL
            ask.done.set_exception(exc)
            return False
        self._next += 1
        ask.serial = self._next
        ask.held, ask.growth_released = self._hold(ask.placement), False
        return True

    def _abandon(self, ask: _Ask) -> None:
        """The caller of ``ask`` left (cancelled): whatever of it is here or placed goes."""
        ask.abandoned = True
        if ask.state == _QUEUED:
            self._asks.remove(ask)
        elif ask.state == _PLACED_HERE:
            self._unhold(ask, flight=True)
            claims = self._placed.get(_claim(ask.placement), [])
            for claim in [c for c in claims if c[0] == ask.serial]:
                claims.remove(claim)
            if not claims:
                self._placed.pop(_claim(ask.placement), None)
            self._post([_FINISHED, ask.serial])
            ask.state = _LOCAL
        # _PLACING: the group's reply decides (above); _LOCAL: nothing is left.

    def _give_up(self, ask: _Ask, error: Exception) -> None:
        """The placer stopped with ``ask`` in hand: withdraw it and fail its caller."""
        if ask.state != _PLACING:
            return
        self._unhold(ask, flight=True)
        if ask.serial:
            self._post([_FINISHED, ask.serial])  # ended for the peers if the script ran
        ask.state = _LOCAL
        if not ask.done.done():
            ask.done.set_exception(error)

    def _hold(self, placement: Placement) -> bool:
        """Count the placement here while it is agreed, so that this replica's decisions made
        meanwhile see it (``LoadView.hold``, ``GrowthLedger.hold``); whether it was."""
        member = self._member(placement.model, placement.worker)
        if member is None or self._ledgers is None:
            return False
        member.view.hold(placement.keys, placement.fresh)
        self._ledgers(placement.model).hold(placement.worker, placement.growth)
        return True

    def _unhold(self, ask: _Ask, *, flight: bool) -> None:
        """Withdraw the ask's held growth, and its held flight too if ``flight`` (once each)."""
        if not ask.held or self._ledgers is None:
            return
        p = ask.placement
        if not ask.growth_released:
            self._ledgers(p.model).unhold(p.worker, p.growth)
            ask.growth_released = True
        if flight:
            ask.held = False
            member = self._member(p.model, p.worker)
            if member is not None:
                member.view.unhold(p.keys)

    def sent(self, model: str, address: str, flight: Flight) -> None:
        """The flight of a placed decision takes its placement's serial; any other (a retry
        on another worker, a decision not placed) is appended as placed now."""
        claims = self._placed.get((model, address, flight.keys))
        if claims:
            serial, _ = claims.pop(0)
            if not claims:
                del self._placed[(model, address, flight.keys)]
        else:
            self._next += 1
            serial = self._next
            self._post([_PLACED, serial, model, address, list(flight.keys), list(flight.fresh), 0])
        self._serials[id(flight)] = serial

    def answered(self, flight: Flight) -> None:
        """Tell the end of the flight's prefill."""
        serial = self._serials.get(id(flight))
        if serial is not None:
            self._post([_ANSWERED, serial])

    def finished(self, flight: Flight) -> None:
        """Tell the flight's end."""
        serial = self._serials.pop(id(flight), None)
        if serial is not None:
            self._post([_FINISHED, serial])

    def _unclaimed(self) -> None:
        """End, here and for the peers, placements no request took up in time."""
        now = self.clock()
        for key, claims in list(self._placed.items()):
            for serial, when in [c for c in claims if now - c[1] > _CLAIM_SECONDS]:
                claims.remove((serial, when))
                self._post([_FINISHED, serial])
                member = self._member(key[0], key[1])
                if member is not None:
                    member.view.unhold(key[2])
            if not claims:
                del self._placed[key]

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
            placing = int(any(change[0] == _PLACED for change in batch))
            batch.append([_ALIVE, 0])
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
                    self._expire()
            except Unavailable as exc:
                log.warning(
                    "shared load: stream at %s lost, routing on own counts: %s",
                    self.url,
                    exc.message,
                )
            finally:
                self.following = False
                self._end_peers(lambda peer: True)
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
        if peer == self.replica:
            return
        self._seen[peer] = self.clock()
        for change in changes:
            kind, serial = change[0], change[1]
            if kind == _PLACED:
                model, address, keys, fresh, blocks = change[2:7]
                member = self._member(model, address)
                if member is not None:
                    flight = member.view.adopt(keys, fresh)
                    self._peer_flights[(peer, serial)] = (flight, member.view)
                    if blocks and self._ledgers is not None:
                        self._ledgers(model).record(address, blocks)
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
        """Stop appending and following; peers' flights are ended here."""
        # The tasks stop between two calls (a read blocks for at most ``_block_ms``): a task
        # cancelled inside redis-py's blocking read may never finish.
        self._stopping.set()
        self._wake.set()
        tasks, self._tasks = self._tasks, []
        if self._placer is not None:
            tasks.append(self._placer)  # its round trip ends within the call timeout
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=2 * self._timeout + self._block_ms / 1000)
            for task in late:
                task.cancel()
        # Asked while closing: decided here, as one router decides.
        asks, self._asks = self._asks, []
        for ask in asks:
            ask.state = _LOCAL
            try:
                ask.done.set_result(ask.decide()[1])
            except Exception as exc:
                ask.done.set_exception(exc)
        await self._store.close()


def _fields(placement: Placement) -> list[Any]:
    p = placement
    return [p.model, p.worker, list(p.keys), list(p.fresh), float(p.growth)]


def _claim(placement: Placement) -> tuple[str, str, tuple[int, ...]]:
    return placement.model, placement.worker, placement.keys
