"""A router replica's decisions placed in groups on the shared stream
(``router.replicas.shared_load``).

A decision placed alone would cost a round trip, and a burst's decisions would queue one round
trip each behind each other. Instead, the decisions a replica is asked while one of its
placements is out form the next group: decided in order, each held in this replica's load view
and growth ledger (``LoadView.hold``, ``GrowthLedger.hold``) so that the next one sees it as
one router sees its previous decision, and placed in one round trip (one stream entry); a
refused group (a peer placed something in between) is decided again as a whole on the peers'
entries, at most ``retries`` times, then placed as it stands. An agreed placement's growth goes
to the policy, which records it at once, and its flight stays held until its request goes out
(``LoadView.begin`` takes it over) or is withdrawn when none does in time; a caller that leaves
(cancelled) has its placement withdrawn, and ended for the peers. A burst of N decisions thus
costs a replica about two round trips, not N.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from tokenkeys.errors import Unavailable
from tokenkeys.router.policy.cost import GrowthLedger
from tokenkeys.router.policy.placement import Placement

log = logging.getLogger(__name__)

T = TypeVar("T")

# Where an ask is: waiting for a group, in a group's round trip, placed (held here until its
# request goes out), or done with here (decided locally, failed, or withdrawn).
_QUEUED, _PLACING, _PLACED, _DONE = range(4)


class Stream(Protocol):
    """What placing needs of the shared stream and of this replica's memory."""

    #: Whether the stream is followed now (False: decisions stand locally, unplaced).
    following: bool

    def next_serial(self) -> int:
        """A new serial for one of this replica's flights."""
        ...

    async def append(self, placements: list[tuple[int, Placement]], force: bool) -> bool:
        """Place these (serial, placement) in one round trip, applying what peers appended
        meanwhile; False when a peer's placement came first (unless ``force``). Raises
        :class:`~tokenkeys.errors.Unavailable` when the store fails."""
        ...

    def claim(self, serial: int, placement: Placement) -> None:
        """The placement is agreed: its request, when sent, takes its serial."""
        ...

    def withdraw(self, serial: int, placement: Placement) -> None:
        """An agreed placement no request will take: unclaimed, and ended for the peers."""
        ...

    def ended(self, serial: int) -> None:
        """Tell the peers that ``serial`` ended (ignored there if they never saw it)."""
        ...

    def grew(self, placement: Placement) -> None:
        """Tell the peers the growth of a decision that stands unplaced."""
        ...

    def member(self, model: str, address: str) -> Any:
        """The pool member at ``address`` of ``model`` (its ``view``), or None."""
        ...

    def ledger(self, model: str) -> GrowthLedger | None:
        """The growth ledger of ``model``'s pool, or None before sharing started."""
        ...


@dataclass(eq=False)
class _Ask:
    """One decision asked of :meth:`GroupPlacer.place` and what became of it."""

    decide: Callable[[], tuple[Placement, Any]]
    done: asyncio.Future[Any]
    queued: float
    state: int = _QUEUED
    placement: Placement = field(init=False)
    result: Any = None
    serial: int = 0
    held: bool = False
    growth_held: bool = False
    abandoned: bool = False


class GroupPlacer:
    """Places a replica's decisions on ``stream`` in groups (module doc)."""

    def __init__(self, stream: Stream, *, retries: int) -> None:
        self.stream = stream
        self.retries = retries
        self._asks: list[_Ask] = []
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: Seconds each placed decision took from being asked to agreed (its group's wait
        #: included), decisions made again on peers' placements, and placed as they stood.
        self.place_seconds: deque[float] = deque(maxlen=100_000)
        self.redecided = 0
        self.forced = 0

    async def place(self, decide: Callable[[], tuple[Placement, T]]) -> T:
        """Decide, then place the decision with the others asked meanwhile; local-only (as
        decided, its growth told after the fact) while the stream is not followed."""
        if not self.stream.following or self._closing:
            placement, result = decide()
            self.stream.grew(placement)
            return result
        ask = _Ask(decide, asyncio.get_running_loop().create_future(), time.perf_counter())
        self._asks.append(ask)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._place_asks())
        try:
            result = await ask.done
        except asyncio.CancelledError:
            self._abandon(ask)
            raise
        self._unhold_growth(ask)  # the caller records the growth now; the flight stays held
        return result

    async def _place_asks(self) -> None:
        while self._asks and not self._closing:
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
        for attempt in range(self.retries + 1):
            group = [ask for ask in group if self._decide(ask)]
            if not group:
                return
            if not self.stream.following:
                break
            force = attempt == self.retries
            try:
                appended = await self.stream.append([(a.serial, a.placement) for a in group], force)
            except Unavailable as exc:
                log.debug("shared load: placing failed: %s", exc.message)
                break
            if appended:
                now = time.perf_counter()
                for ask in group:
                    self.stream.claim(ask.serial, ask.placement)
                    ask.state = _PLACED
                    self.place_seconds.append(now - ask.queued)
                    if ask.abandoned:
                        self._abandon(ask)
                    else:
                        ask.done.set_result(ask.result)
                self.forced += force * len(group)
                return
            self.redecided += len(group)
            for ask in group:
                self._unhold(ask)
        # Not placed: the decisions stand locally, their growth told after the fact (and
        # their placements ended for the peers, in case the script ran and its reply was lost).
        for ask in group:
            self._unhold(ask)
            ask.state = _DONE
            if self.stream.following:
                self.stream.ended(ask.serial)
            if not ask.abandoned:
                self.stream.grew(ask.placement)
                ask.done.set_result(ask.result)

    def _decide(self, ask: _Ask) -> bool:
        """Make the ask's decision and hold it here; False when it is gone (abandoned, or the
        decision failed: the error is its caller's)."""
        if ask.abandoned:
            return False
        try:
            ask.placement, ask.result = ask.decide()
        except Exception as exc:
            ask.state = _DONE
            ask.done.set_exception(exc)
            return False
        ask.serial = self.stream.next_serial()
        p = ask.placement
        member, ledger = self.stream.member(p.model, p.worker), self.stream.ledger(p.model)
        ask.held = ask.growth_held = member is not None and ledger is not None
        if ask.held:
            member.view.hold(p.keys, p.fresh)
            ledger.hold(p.worker, p.growth)
        return True

    def _unhold_growth(self, ask: _Ask) -> None:
        if ask.growth_held:
            ask.growth_held = False
            ledger = self.stream.ledger(ask.placement.model)
            if ledger is not None:
                ledger.unhold(ask.placement.worker, ask.placement.growth)

    def _unhold(self, ask: _Ask) -> None:
        """Withdraw what the ask holds here: its growth, then its flight (once each)."""
        self._unhold_growth(ask)
        if ask.held:
            ask.held = False
            member = self.stream.member(ask.placement.model, ask.placement.worker)
            if member is not None:
                member.view.unhold(ask.placement.keys)

    def _abandon(self, ask: _Ask) -> None:
        """The caller of ``ask`` left (cancelled): whatever of it is here or placed goes."""
        ask.abandoned = True
        if ask.state == _QUEUED:
            self._asks.remove(ask)
        elif ask.state == _PLACED:
            self._unhold(ask)
            self.stream.withdraw(ask.serial, ask.placement)
            ask.state = _DONE
        # _PLACING: the group's reply decides (above); _DONE: nothing is left.

    def _give_up(self, ask: _Ask, error: Exception) -> None:
        """Placing stopped with ``ask`` in hand: withdraw it and fail its caller."""
        if ask.state != _PLACING:
            return
        self._unhold(ask)
        if ask.serial:
            self.stream.ended(ask.serial)  # ended for the peers if the script ran
        ask.state = _DONE
        if not ask.done.done():
            ask.done.set_exception(error)

    async def close(self, timeout: float) -> None:
        """Stop placing: the group out finishes within ``timeout`` seconds (else it is
        cancelled); decisions still asked are decided here, as one router decides them."""
        self._closing = True
        if self._task is not None:
            _, late = await asyncio.wait([self._task], timeout=timeout)
            for task in late:
                task.cancel()
        asks, self._asks = self._asks, []
        for ask in asks:
            ask.state = _DONE
            try:
                ask.done.set_result(ask.decide()[1])
            except Exception as exc:
                ask.done.set_exception(exc)
