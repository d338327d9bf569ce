"""New prompts replicas placed at the same instant, reconciled after the fact: one prompt on two
workers brought back to one, a burst piled on one worker balanced.

Replicas decide at once on their own memory (``router.replicas.shared_load``), so two of them
deciding one new prompt in the same instant (two conversations opening with one system prompt)
may put it on two workers, and both compute it: a *split* (``router.replicas.contention``).
No rule a replica applies alone at the instant avoids it without unbalancing the workers
(docs/benchmarks.md, the bench_routing notes). But the decision is not the end of the request:
its prefill takes tens of milliseconds, and the peers' entries arrive within a few. So the
split is repaired after the decision, off its path, before the request's first output:

- Every replica reads the same stream in the same order, its own entries included. The first
  placement of a prompt new where it went (it prefills from its first block) *claims* that
  first block for its worker, until its request ends (its ``FINISHED`` change) or ``window``
  seconds pass.
- A later placement of the same first block on another worker, decided without the claim (its
  ``seen`` position is before the claim's entry), is the *later copy*. The replica that made
  it moves its request to the claim's worker if no output of it has arrived yet: the attempt
  is aborted (as a client disconnecting aborts it at the worker) and the same request is sent
  to the claim's worker, as a request that fails before its first output is sent to the next
  worker (``router.routed_engine``). The client sees one answer, the other worker's.
- Because the order is the stream's and every replica applies the same rule to it, exactly the
  later copies move, never the first, and no two replicas disagree on which is which. A later
  copy past its first output stays where it is (counted: ``late``); so does one whose sender
  cannot move it or whose peer's worker is not in this replica's pool (``unmovable``). The
  front door (``router.forwarding.door``) moves a request until its answer's head arrives:
  whole answers move, streamed ones mostly not (their head comes at once).
- The stream's order also *balances* what replicas opened at the same instant. Each replica
  balances its own new prompts, not against its peers' of the same instant: in a burst several
  may pick one worker, which then holds all their conversations (and evicts their histories)
  for the rest of their turns. So every replica counts what the placements in flight bring to
  each worker's cache as the stream tells them (each placement its blocks to compute until its
  end; a later copy, where it goes, only its blocks past the prompt it copies), and a new
  prompt whose sender decided without a peer's placement the stream puts before it, on a worker
  holding at least half of it more than the least held worker, is claimed for that worker
  instead: its sender moves it there, its copies follow. The copies are counted by what they
  add, not whole, because which copies a burst shows first is chance: counted whole, a worker
  whose prompts' copies came first would pass new prompts to the others, whose copies then
  join them there (one router's growth term counts new blocks alike). One sender's placements
  of one new prompt in one entry (its conversations opening with it) are weighed and moved
  together, after the entry's copies of earlier claims are counted where they go (a burst
  comes in one entry, and its sender did not know where those go). Balanced are only
  placements that may go to any worker of the pool and whose sender can move them
  (``movable``: not a streamed answer through the front door, which starts at once). One
  router has this balance by construction: it sees all its own decisions.
- A moved request leaves its prompt cached where its first attempt ran too (the engine keeps
  the blocks it computed), so at its conversation's next turn two workers hold it alike, and
  within the replica slack the rendezvous hash would pick between them, sending the
  conversation back to the worker it left half the time (more often in a burst, when a
  replica has not yet heard its peers' requests on the worker left). Every replica remembers
  where each moved prompt went and which worker it left (:mod:`router.replicas.homes`), and the
  policy keeps the next turn there (``router.policy.precise.at_home``) when it holds as much
  and costs no more than the slack above the cheapest, the worker left priced without what
  the moved attempt left there.

The decision stays immediate and local: nothing here runs on its path. What a move costs is a
prefill begun and dropped at the first worker (its blocks may stay in that worker's cache, as a
disconnected client's do) and the time until the entries arrive, added to that request's first
output. One router never reconciles (``LocalLoad``: it sees all its own decisions).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tokenkeys.router.replicas.held import HeldBlocks
from tokenkeys.router.replicas.homes import Homes
from tokenkeys.router.replicas.shared_stream import FINISHED, PLACED, entry_id
from tokenkeys.router.workers.load_view import Flight

#: How many reconciliation timings are kept (:attr:`Reconciler.lead`, :attr:`Reconciler.behind`).
_TIMINGS = 100_000


@dataclass
class _Claim:
    """The first placement of a new prompt's first block in the stream's order."""

    replica: str
    serial: int
    #: Where the prompt goes: its sender's worker, or the least held one when balanced.
    worker: str
    at: tuple[int, int]
    read: float
    #: Where its sender placed it first (copies that followed it there follow the claim).
    placed: str = ""
    #: Balanced, and its sender's attempt at ``worker`` not yet in the stream.
    pending: bool = False
    #: The prompt's block keys (a copy brings to ``worker`` only the blocks past them).
    keys: Sequence[int] = ()


@dataclass
class _Own:
    """One of this replica's requests, as long as it may be moved."""

    model: str
    flight: Flight
    sent: float
    #: When its first output arrived, and when a move was found for it (None: not yet).
    first: float | None = None
    found: float | None = None
    #: Resolved with the worker to move to (None: its sender cannot move it).
    move: asyncio.Future[str] | None = None


class Reconciler:
    """Finds this replica's later copies of a new prompt in the stream (module doc).

    ``replica``: this replica's id in the stream; ``member(model, address)``: the pool member
    there or None (a request moves only to a worker this replica routes to); ``workers(model)``
    the addresses of ``model``'s pool, among which new prompts are balanced (None: never
    balanced); ``silence`` and ``hold`` as :class:`~tokenkeys.router.replicas.held.HeldBlocks`
    takes them.
    """

    def __init__(
        self,
        replica: str,
        member: Callable[[str, str], Any],
        *,
        workers: Callable[[str], Sequence[str]] | None = None,
        window: float = 10.0,
        silence: float = 5.0,
        hold: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replica = replica
        self.member = member
        self.workers = workers
        self.window = window
        self.clock = clock
        self.held = HeldBlocks(silence=silence, hold=hold)
        self._claims: dict[tuple[str, int], _Claim] = {}
        self._claimed: dict[tuple[str, int], tuple[str, int]] = {}  # (replica, serial) -> key
        self._order: deque[tuple[tuple[str, int], _Claim]] = deque()  # claims, oldest first
        self._own: dict[int, _Own] = {}
        #: Where the prompts moved here went, for their next turns (``Placements.home``).
        self.homes = Homes()
        #: Later copies moved before their first output; those found past it (left where they
        #: were, and those whose output arrived in the instant of the move); those whose
        #: sender cannot move them.
        self.moved = 0
        self.late = 0
        self.unmovable = 0
        #: This replica's new prompts the stream's order claimed for another worker than the
        #: one it chose (each also counted as moved, late or unmovable).
        self.balanced = 0
        #: Seconds from a moved request's sending to its move (the entries' arrival).
        self.lead: deque[float] = deque(maxlen=_TIMINGS)
        #: Seconds from a late copy's first output to the entry that found it.
        self.behind: deque[float] = deque(maxlen=_TIMINGS)

    # --------------------------------------------------------------- this replica's requests

    def sent(self, serial: int, model: str, flight: Flight) -> None:
        """This replica sent a request (told as ``serial``)."""
        self._own[serial] = _Own(model, flight, self.clock())

    def movable(self, serial: int) -> asyncio.Future[str] | None:
        """A future resolved with the worker the request should move to, if it is a later copy
        found before its first output (None: the request is not known here)."""
        own = self._own.get(serial)
        if own is None:
            return None
        if own.move is None:
            own.move = asyncio.get_running_loop().create_future()
        return own.move

    def answered(self, serial: int) -> None:
        """The request's first output reached its sender: it is no longer moved. (A sender
        that took an output over a move found in the same instant: counted as late.)"""
        own = self._own.get(serial)
        if own is None or own.first is not None:
            return
        own.first = self.clock()
        if own.found is not None:
            self.late += 1
            self.behind.append(0.0)

    def finished(self, serial: int) -> None:
        """The request ended, or was moved (its new attempt is told as a new request)."""
        own = self._own.pop(serial, None)
        if own is None or own.move is None:
            return
        if own.found is not None and own.first is None:
            self.moved += 1
            self.lead.append(own.found - own.sent)
        elif not own.move.done():
            own.move.cancel()

    # ------------------------------------------------------------------- the stream's order

    def entry(self, replica: str, changes: Sequence[list[Any]], at: tuple[int, int]) -> None:
        """One stream entry (any replica's, this one's included), in the stream's order."""
        self.held.heard(replica, at)
        # Three passes. First the placements of prompts claimed before this entry: a sender's
        # burst comes in one entry, and where its copies of earlier claims go (which it did
        # not know when it decided) counts before its new prompts are balanced. Then the
        # others, one first block's placements on one worker together (one sender's
        # conversations opening one new prompt, weighed and moved together). Then the ends.
        claims = self._claims
        groups: dict[tuple[str, str, int], list[list[Any]]] = {}
        ends = []
        for change in changes:
            kind = change[0]
            if kind == FINISHED:
                ends.append(change[1])
            elif kind != PLACED:
                continue
            elif change[4] and (change[2], change[4][0]) in claims:
                self._placed(replica, change, at, len(change[5]))
            else:
                first = change[4][0] if change[4] else None
                groups.setdefault((change[2], change[3], first), []).append(change)
        for group in groups.values():
            # What the group brings to its worker's cache: the first prompt's blocks to
            # compute, and of every other only those past the first's.
            head = group[0][4]
            blocks = len(group[0][5]) + sum(adds(c[4], c[5], head) for c in group[1:])
            for change in group:
                self._placed(replica, change, at, blocks)
        for serial in ends:
            self._finished(replica, serial)

    def _finished(self, replica: str, serial: int) -> None:
        self.held.release(replica, serial)
        key = self._claimed.pop((replica, serial), None)
        if key is None:
            return
        claim = self._claims.get(key)
        if claim is None or (claim.replica, claim.serial) != (replica, serial):
            return
        if not claim.pending:
            del self._claims[key]
        # A balanced claim's first attempt ended to be moved: the claim waits for its attempt
        # at the claim's worker (or the window).

    def _placed(self, replica: str, change: list[Any], at: tuple[int, int], group: int) -> None:
        serial, model, worker, keys, fresh = change[1:6]
        seen = change[7] if len(change) > 7 else None
        now = self.clock()
        self._expire(now)
        counted = worker  # where the stream counts it
        grows = len(fresh)  # the blocks it brings to that worker's cache
        claim = self._claims.get((model, keys[0])) if keys else None
        new = bool(keys) and bool(fresh) and fresh[0] == keys[0]
        if claim is None:
            if new:
                counted = self._claim(replica, change, group, at, now)
        elif claim.worker == worker:
            if claim.pending and replica == claim.replica:
                # The balanced claim's attempt at its worker: the claim is that request's now.
                claim.serial, claim.pending = serial, False
                self._claimed[(replica, serial)] = (model, keys[0])
            else:
                grows = adds(keys, fresh, claim.keys)
        elif (new or worker == claim.placed) and self._follows(claim, replica, worker, seen):
            # The copy goes to the claim's worker: held there from now on every replica (its
            # sender moves it, or its end releases it).
            counted = claim.worker
            grows = adds(keys, fresh, claim.keys)
            self.homes.moved(model, keys, fresh, claim.worker, worker)
            if replica == self.replica:  # a peer's copy is the peer's to move
                self._move(serial, model, claim.worker, now)
        self.held.hold(replica, serial, model, counted, grows, at)

    def _claim(
        self, replica: str, change: list[Any], group: int, at: tuple[int, int], now: float
    ) -> str:
        """Claim a new prompt's first block for its worker, or for the least held one when its
        sender decided without a peer's placement before it (module doc); the claim's worker.
        ``group``: the blocks the entry's placements of the prompt on that worker bring to its
        cache."""
        serial, model, worker, keys, fresh = change[1:6]
        seen = change[7] if len(change) > 7 else None
        movable = bool(change[8]) if len(change) > 8 else False
        target = worker
        if movable and self.workers is not None and self.held.missed(replica, seen):
            target = self.held.least(model, worker, self.workers(model), keys[0], group)
        key = (model, keys[0])
        claim = self._claims[key] = _Claim(
            replica, serial, target, at, now, worker, target != worker, keys
        )
        self._claimed[(replica, serial)] = key
        self._order.append((key, claim))
        if target != worker:
            self.homes.moved(model, keys, fresh, target, worker)
            if replica == self.replica:
                self.balanced += 1
                self._move(serial, model, target, now)
        return target

    @staticmethod
    def _follows(claim: _Claim, replica: str, worker: str, seen: Any) -> bool:
        """Whether a copy of the claim's prompt on ``worker`` (not the claim's) goes to the
        claim's worker: it followed the claim where its sender placed it, or it was decided
        without the claim. One decided knowing it stays: the cost model chose another worker."""
        if worker == claim.placed:
            return True
        if claim.replica == replica:
            return False  # one replica's own decisions never split its new prompt
        return not (seen and entry_id(seen) >= claim.at)

    def _move(self, serial: int, model: str, worker: str, now: float) -> None:
        """Move this replica's request ``serial`` to ``worker`` if no output of it arrived."""
        own = self._own.get(serial)
        if own is None:
            return  # already ended
        if own.first is not None:
            self.late += 1
            self.behind.append(now - own.first)
        elif own.move is None or self.member(model, worker) is None:
            self.unmovable += 1
        elif not own.move.done():
            # Counted as moved when the attempt ends (cancelled by its sender, which then
            # sends it to ``worker``).
            own.move.set_result(worker)
            own.found = now

    def _expire(self, now: float) -> None:
        """Drop the claims read more than ``window`` seconds ago (their end may never come:
        a change Redis did not take, a peer gone), oldest first."""
        order = self._order
        while order and now - order[0][1].read > self.window:
            key, claim = order.popleft()
            if self._claims.get(key) is claim:
                del self._claims[key]
                self._claimed.pop((claim.replica, claim.serial), None)

    def claimant(self, model: str, first_key: int) -> str | None:
        """The worker that holds the claim on a new prompt's first block now, or None."""
        claim = self._claims.get((model, first_key))
        return None if claim is None else claim.worker

    def reset(self) -> None:
        """Forget every claim and hold (the stream is lost: its order is no longer known)."""
        self._claims.clear()
        self._claimed.clear()
        self._order.clear()
        self.held.reset()
        self.homes.clear()


def adds(keys: Sequence[int], fresh: Sequence[int], prompt: Sequence[int]) -> int:
    """The blocks a placement of ``keys`` (``fresh`` of them to compute where its sender put
    it) brings to a worker that holds or computes ``prompt``: those past their common prefix."""
    return min(len(fresh), beyond(keys, prompt))


def beyond(keys: Sequence[int], other: Sequence[int]) -> int:
    """How many of ``keys`` follow their common prefix with ``other``. Block keys chain (each
    hashes its parent's), so two prompts' keys agree exactly up to where they part: the
    common prefix is found by bisection."""
    low, high = 0, min(len(keys), len(other))
    while low < high:  # keys[:low] is common; is keys[:mid] too?
        mid = (low + high + 1) // 2
        if keys[mid - 1] == other[mid - 1]:
            low = mid
        else:
            high = mid - 1
    return len(keys) - low
