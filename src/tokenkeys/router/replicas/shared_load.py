"""What router replicas share: the requests each has in flight, and the cache growth it caused.

One router counts the requests it sent and has not seen answered (``load_view``): their blocks
in use, their prefill still queued, the new blocks it put into each worker's cache (the cost
model's growth). Replicas behind one load balancer each see only their share of a burst, so
two of them may send two new prefixes to one worker before any event or load poll shows it.
:class:`SharedLoad` is how they tell each other:

- :class:`LocalLoad` shares nothing (one router; today's behaviour; it and the
  :class:`SharedLoad` protocol live in ``router.replicas.sharing``).
- :class:`RedisSharedLoad` appends every request it sends (its worker, block keys, the blocks
  it prefills there, the growth its decision priced), every first output and end to one Redis
  stream of the namespace (``router.replicas.shared_stream``), and applies what the other
  replicas append to its own load views and growth ledgers, in the stream's order.

A decision waits for nothing: it is made on this replica's memory at once, exactly as one
router makes it, and what it placed is told afterwards. A background task appends the changes
in batches (one ``XADD`` per batch; the changes made while one is out form the next), and a
follower reads the peers' with ``XREAD BLOCK``, folding each entry in as it arrives. So the
decision path makes no network call, and Redis being slow or away never delays a request.
The price: two replicas deciding within the same moment (before either's entry reached the
other) decide without each other. That is counted, not hidden (``router.replicas.contention``:
prefixes placed on two workers at once and computed twice, unrelated new prefixes piled on one
worker), and exported on /metrics (``router.replicas.metrics``). A split is then undone after
the decision: reading the stream in its one order (its own entries included), a replica moves
its later copy of a new prompt to the worker a peer's earlier entry placed it on, before the
copy's first output (``router.replicas.reconcile``).

This follows Dynamo's router replica sync (ai-dynamo/dynamo ``lib/llm/src/kv_router/
sequence.rs``, ``--router-replica-sync``: each replica broadcasts its active-sequence events to
the others beside its decisions, not in front of them), over Redis instead of NATS, so a
deployment that shares the index in Redis needs nothing else. On a Redis Cluster any node
serves as the URL (the stream lives on the slot of its hash tag; the cluster client finds it).

A peer's flights are only as good as its entries (``router.replicas.peer_flights``). A replica
that stops appending (crashed, cut off) sends a heartbeat no more: after ``peer_timeout``
seconds its flights are ended here. When this replica loses the stream it ends every peer
flight it holds, says so (a warning, ``following`` 0 on /metrics) and routes on its own counts,
as one router does, until it follows the stream again from its newest entry; entries of
flights it never saw start are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack

from tokenkeys.errors import Unavailable
from tokenkeys.router.index.redis_store import RedisStore
from tokenkeys.router.policy.cost import GrowthLedger
from tokenkeys.router.policy.placement import Home, Placement, T
from tokenkeys.router.replicas.contention import Contention, OwnPlacement
from tokenkeys.router.replicas.peer_flights import PeerFlights
from tokenkeys.router.replicas.reconcile import Reconciler
from tokenkeys.router.replicas.shared_stream import (
    ALIVE,
    ANSWERED,
    FINISHED,
    GREW,
    MAXLEN,
    PLACED,
    READ_LIMIT,
    Cursor,
    stream_key,
)
from tokenkeys.router.replicas.sharing import Ledgers
from tokenkeys.router.workers.load_view import Flight
from tokenkeys.router.workers.pool import Pool

log = logging.getLogger(__name__)

#: Seconds a decision's growth waits for its request (``sent``) before it is told alone (its
#: worker left the pool before the request went out).
_CLAIM_SECONDS = 2.0
#: How many fold-in lags (:attr:`RedisSharedLoad.fold_lag`) are kept.
_LAGS = 100_000


def _resolve(wake: asyncio.Future[None] | None) -> None:
    """Wake the publisher waiting on ``wake`` (if it waits)."""
    if wake is not None and not wake.done():
        wake.set_result(None)


class RedisSharedLoad:
    """:class:`SharedLoad` over a Redis stream (see the module doc).

    ``url``: any node of the Redis (or Redis Cluster) the replicas share; ``namespace``: the
    pool's (the stream is ``tokenkeys:{<namespace>:load}``); ``heartbeat`` seconds between
    this replica's signs of life; ``peer_timeout`` seconds of a peer's silence after which its
    flights are ended here; ``timeout`` bounds each Redis call (never a decision's: none
    makes one).
    """

    replicated = True

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "tokenkeys",
        heartbeat: float = 1.0,
        peer_timeout: float = 5.0,
        timeout: float = 1.0,
        reconcile: bool = True,
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
        self._outbox_own: list[OwnPlacement] = []
        # Resolved to wake the publisher (a change posted, or stopping); None while it is
        # not waiting.
        self._wake: asyncio.Future[None] | None = None
        self._stopping = asyncio.Event()
        self._serials: dict[int, int] = {}  # id(own flight) -> serial
        self._next = 0
        # Decisions whose request has not gone out yet: (model, address, keys) -> [(growth,
        # when)], oldest first; ``sent`` tells the growth with the request.
        self._decided: dict[tuple[str, str, tuple[int, ...]], list[tuple[float, float]]] = {}
        self._cursor = Cursor()
        # Peers' flights applied here (their timeout and clock are this replica's).
        self._peers = PeerFlights(self.member, self.ledger, timeout=peer_timeout, clock=clock)
        self._tasks: list[asyncio.Task[None]] = []
        self._pools: Mapping[str, Pool] = {}
        self._ledgers: Ledgers | None = None
        #: Decisions made here and by peers without each other (``router.replicas.contention``).
        self.contention = Contention(clock=clock)
        #: This replica's later copies of new prompts, found in the stream's order.
        self.reconciler = Reconciler(
            self.replica, self.member, workers=self.workers, silence=peer_timeout, clock=clock
        )
        #: Whether this replica moves its later copies (the policy reads it too).
        self.reconciles = reconcile
        #: Changes not appended because Redis could not be reached (for /metrics, tests).
        self.dropped = 0
        #: Changes appended, and the ``XADD`` calls (batches) that carried them.
        self.appended = 0
        self.batches = 0
        #: Seconds from a peer's entry being appended to its being applied here (wall clocks).
        self.fold_lag: deque[float] = deque(maxlen=_LAGS)
        #: Whether the stream is followed now (False: local-only).
        self.following = False

    # ------------------------------------------------------------------ this replica's side

    def _post(self, item: list[Any], own: OwnPlacement | None = None) -> None:
        self._outbox.append(item)
        if own is not None:
            self._outbox_own.append(own)
        _resolve(self._wake)

    async def place(self, decide: Callable[[], tuple[Placement, T]]) -> T:
        """Decide on this replica's memory, at once; the decision's growth is told with its
        request (:meth:`sent`). Never suspends: no network call on a decision's path."""
        placement, result = decide()
        p = placement
        self._decided.setdefault((p.model, p.worker, p.keys), []).append(
            (float(p.growth), self.clock())
        )
        return result

    def home(self, model: str, keys: Sequence[int], blocks: int) -> Home | None:
        """Where the stream's order moved a prompt cached alike on several workers."""
        return self.reconciler.homes.find(model, keys, blocks) if self.reconciles else None

    def member(self, model: str, address: str) -> Any:
        """The pool member at ``address`` of ``model``, or None."""
        pool = self._pools.get(model)
        return None if pool is None else pool.members.get(address)

    def workers(self, model: str) -> list[str]:
        """The addresses of ``model``'s pool, in one order (none before :meth:`start`)."""
        pool = self._pools.get(model)
        return [] if pool is None else sorted(pool.members)

    def ledger(self, model: str) -> GrowthLedger | None:
        """The growth ledger of ``model``'s pool (None before :meth:`start`)."""
        return None if self._ledgers is None or model not in self._pools else self._ledgers(model)

    def sent(self, model: str, address: str, flight: Flight, *, movable: bool = False) -> None:
        """Tell the request, with its decision's growth (none: a retry on another worker) and
        whether it is ``movable`` (``SharedLoad.sent``)."""
        key = (model, address, flight.keys)
        growth = 0.0
        decided = self._decided.get(key)
        if decided:
            growth, _ = decided.pop(0)
            if not decided:
                del self._decided[key]
        self._next += 1
        serial = self._serials[id(flight)] = self._next
        own = self.contention.decided(model, address, flight.keys, flight.fresh)
        change = [PLACED, serial, model, address, list(flight.keys), list(flight.fresh), growth]
        self._post([*change, self._cursor.id, int(movable and self.reconciles)], own)
        if self.reconciles:
            self.reconciler.sent(serial, model, flight)

    def moves(self, flight: Flight) -> asyncio.Future[str] | None:
        """Resolved with the worker a peer placed this request's new prompt on first
        (``router.replicas.reconcile``), while no output of it has arrived."""
        serial = self._serials.get(id(flight))
        return None if serial is None else self.reconciler.movable(serial)

    def answered(self, flight: Flight) -> None:
        """Tell the end of the flight's prefill."""
        serial = self._serials.get(id(flight))
        if serial is not None:
            self._post([ANSWERED, serial])
            self.reconciler.answered(serial)

    def finished(self, flight: Flight) -> None:
        """Tell the flight's end."""
        serial = self._serials.pop(id(flight), None)
        if serial is not None:
            self._post([FINISHED, serial])
            self.reconciler.finished(serial)

    def _unclaimed(self) -> None:
        """Tell the growth of decisions whose request never went out in time, alone."""
        now = self.clock()
        for key in list(self._decided):
            keep = []
            for growth, when in self._decided[key]:
                if now - when > _CLAIM_SECONDS:
                    self._post([GREW, 0, key[0], key[1], growth])
                else:
                    keep.append((growth, when))
            if keep:
                self._decided[key] = keep
            else:
                del self._decided[key]

    async def start(self, pools: Mapping[str, Pool], ledgers: Ledgers) -> None:
        """Start appending and following (in the background; Redis may be away)."""
        self._pools, self._ledgers = pools, ledgers
        self._tasks = [asyncio.create_task(self._publish()), asyncio.create_task(self._follow())]

    async def _publish(self) -> None:
        loop = asyncio.get_running_loop()
        # The first sign of life goes out at once: it opens the connection the batches use,
        # which the first burst would otherwise wait for (a connect and handshake of several
        # round trips, each a turn of a loop busy deciding: 175 ms in bench_routing's first
        # round, when its first outputs came after 115 ms).
        announce = True
        while not self._stopping.is_set():
            if not self._outbox and not announce:
                # Until a change is posted or a heartbeat is due. A plain future wakes this
                # task in the loop's next turn; an Event under wait_for took two more turns,
                # in which a burst's requests went out to the workers ahead of the batch
                # telling the peers of them (and of the copies to reconcile).
                self._wake = wake = loop.create_future()
                timer = loop.call_later(self.heartbeat, _resolve, wake)
                try:
                    await wake
                finally:
                    timer.cancel()
                    self._wake = None
            announce = False
            self._unclaimed()
            batch, self._outbox = self._outbox, []
            owns, self._outbox_own = self._outbox_own, []
            batch.append([ALIVE, 0])
            data = msgpack.packb([self.replica, batch])
            command = ("XADD", self.key, "MAXLEN", "~", MAXLEN, "*", "r", self.replica, "d", data)
            try:
                at = await self._store.command("publish", *command)
            except Unavailable as exc:
                self.dropped += len(batch) - 1
                log.debug("shared load: appending to %s failed: %s", self.url, exc.message)
                continue
            self.appended += len(batch) - 1
            self.batches += 1
            self.contention.appended(owns, at)

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
                if self.following:
                    log.warning(
                        "shared load: stream at %s lost, routing on this replica's own "
                        "counts until it is back: %s",
                        self.url,
                        exc.message,
                    )
            finally:
                self.following = False
                self._peers.end_all()
                self.reconciler.reset()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, 2.0)

    def _take(self, raw: Any) -> None:
        now_ms = time.time() * 1000
        for at, replica, data in self._cursor.after(raw):
            mine = replica.decode() == self.replica
            if mine and not self.reconciles:
                continue
            message = msgpack.unpackb(data)
            if not mine:
                self.fold_lag.append(max(now_ms - at[0], 0.0) / 1000)
                self.apply(message, at)
            if self.reconciles:  # every replica's entries, this one's too, in the stream's order
                self.reconciler.entry(message[0], message[1], at)

    def apply(self, message: list[Any], at: tuple[int, int] = (0, 0)) -> None:
        """Apply one appended batch (``[replica, changes]``, stream entry ``at``); this
        replica's own is skipped."""
        peer, changes = message
        if peer == self.replica:
            return
        self._peers.apply(peer, changes)
        for change in changes:
            if change[0] == PLACED and len(change) > 7:
                model, address, keys, fresh, _, seen = change[2:8]
                self.contention.peer_placed(model, address, keys, fresh, seen, at)

    @property
    def peer_flights(self) -> int:
        """Peers' requests in flight applied here now."""
        return len(self._peers)

    async def close(self) -> None:
        """Stop appending and following; peers' flights are ended here."""
        # The tasks stop between two calls (a read blocks for at most ``_block_ms``): a task
        # cancelled inside redis-py's blocking read may never finish.
        self._stopping.set()
        _resolve(self._wake)
        tasks, self._tasks = self._tasks, []
        if tasks:
            timeout = 2 * self._timeout + self._block_ms / 1000
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
        await self._store.close()
