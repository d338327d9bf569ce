"""What one router knows of one worker's load: its last GetLoad, and its own requests there.

A poll is a snapshot, up to a poll interval old, and a burst of requests is routed faster than
any poll. So the router counts what it sent: the requests it has in flight at the worker and
their prompt block keys (as Dynamo's router tracks its active sequences per worker,
ai-dynamo/dynamo ``lib/llm/src/kv_router/sequence.rs``). The worker's blocks in use are then
estimated as other clients' share of the last snapshot, fading as it ages (other clients'
requests finish too: with the time constant of this router's own requests there, the best
guess it has), plus its own in-flight blocks now.

Of its own requests the router also knows which are still in prefill: the blocks each one
computes there (those not cached when it was sent) are queued prefill until its first output
arrives, as Dynamo counts a request's prefill tokens until it is marked prefill-completed on
its first streamed item (``lib/llm/src/kv_router.rs`` ``KvPushRouter``). The worker's KV
capacity comes with each poll.

Router replicas sharing their load (``router.replicas.shared_load``) add the peers' requests
to the same counts (:meth:`LoadView.adopt`), as their stream entries arrive.

The counts of this router's own requests check the worker (``trust``): one that reports fewer
requests than this router itself has sent there and not seen end is not believed
(:attr:`LoadView.load` takes the larger), and the polls that did so are counted; requests sent
since its last event batch tell a silent worker. Peers' flights never enter that
check: whether a peer's request reached the worker, or ended, is only as timely as the peer's
stream entries.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field

from tokenkeys.router.index.table import count_absent, held_prefix

# Weight of the newest request in the running mean of request durations.
_NEWEST = 0.2


@dataclass
class Flight:
    """One request this router has in flight at the worker (:meth:`LoadView.begin`).

    ``fresh``: the prompt's blocks the worker computes, i.e. those neither cached there nor
    held by another of this router's requests when it was sent; ``prefilling`` until its
    first output arrives.
    """

    keys: tuple[int, ...]
    fresh: tuple[int, ...]
    started: float
    prefilling: bool = True
    #: Sent by this router (:meth:`LoadView.begin`), not a peer's.
    own: bool = False


@dataclass
class LoadView:
    """The router's view of one worker's load (see the module doc). ``clock``: seconds."""

    clock: Callable[[], float] = time.monotonic
    #: From the last GetLoad: running + queued requests, fraction of KV blocks in use, KV blocks
    #: referenced by running requests, KV capacity in blocks (0: not reported); when it
    #: arrived and how many blocks were this router's.
    polled_load: float = 0.0
    kv_usage: float = 0.0
    used_kv_blocks: int = 0
    capacity: int = 0
    polled_at: float = 0.0
    own_blocks_at_poll: int = 0
    #: This router's requests in flight there, and their prompts' block keys (one count per
    #: request using a key).
    inflight: int = 0
    inflight_keys: Counter[int] = field(default_factory=Counter)
    #: Of those, the requests this router itself sent (what the worker must at least report).
    sent: int = 0
    #: The fresh blocks of those requests still in prefill (one count per request).
    prefilling_keys: Counter[int] = field(default_factory=Counter)
    #: Running mean of how long this router's requests there took (None before the first).
    request_seconds: float | None = None
    #: Consecutive polls that reported fewer requests than this router had in flight, and the
    #: last such claim (reported, in flight).
    underreports: int = 0
    last_claim: tuple[float, int] = (0.0, 0)
    #: ``wall`` time of the last request sent there, and of the first one sent since the
    #: worker's last applied event batch (None: none since; see :meth:`events_applied`).
    wall: Callable[[], float] = time.time
    last_sent: float | None = None
    waiting_since: float | None = None

    @property
    def load(self) -> float:
        """Requests there, for the baselines' tie-breaks: as polled, or in flight if more."""
        return max(self.polled_load, float(self.inflight))

    @property
    def own_blocks(self) -> int:
        """Blocks this router's in-flight requests use there: the distinct full blocks of
        their prompts plus one partial block per request."""
        return len(self.inflight_keys) + self.inflight

    @property
    def active_blocks(self) -> float:
        """KV blocks in use there now, as far as this router can tell (module doc)."""
        others = float(max(self.used_kv_blocks - self.own_blocks_at_poll, 0))
        if others and self.request_seconds:
            age = max(self.clock() - self.polled_at, 0.0)
            others *= math.exp(-age / self.request_seconds)
        return others + self.own_blocks

    def queued_prefill(self, prompt_keys: Set[int]) -> int:
        """Blocks this router's requests there still have to prefill, other than the blocks
        of the prompt (``prompt_keys``: those it would compute itself anywhere else)."""
        # Every block in prefill there, once per candidate and decision: the walk runs in C.
        return count_absent(self.prefilling_keys, prompt_keys)

    def polled(
        self,
        running_and_queued: float,
        kv_usage: float,
        used_kv_blocks: int,
        total_kv_blocks: int = 0,
    ) -> None:
        """Take a GetLoad answer."""
        self.polled_load = running_and_queued
        self.kv_usage = kv_usage
        self.used_kv_blocks = used_kv_blocks
        self.capacity = total_kv_blocks
        self.polled_at = self.clock()
        self.own_blocks_at_poll = self.own_blocks
        if running_and_queued < self.sent:
            self.underreports += 1
            self.last_claim = (running_and_queued, self.sent)
        else:
            self.underreports = 0

    def waiting_after(self, applied_at: float | None) -> float | None:
        """:attr:`waiting_since` once the batch applied at ``applied_at`` (``wall`` time) is
        taken into account; changes nothing (:meth:`events_applied` takes it)."""
        if applied_at is None or self.waiting_since is None or applied_at < self.waiting_since:
            return self.waiting_since
        # Requests sent after that batch are still waiting for theirs; the last one sent is
        # the latest of them (an estimate on the late side: silence is never overstated).
        sent = self.last_sent
        return sent if sent is not None and sent > applied_at else None

    def events_applied(self, applied_at: float | None) -> None:
        """The worker's last event batch was applied at ``applied_at`` (``wall`` time)."""
        self.waiting_since = self.waiting_after(applied_at)

    def inflight_prefix(self, keys: Sequence[int]) -> int:
        """How many leading ``keys`` this router's in-flight requests there reference."""
        # Up to every block of the prompt, once per candidate and decision: the walk runs in C.
        return held_prefix(keys, self.inflight_keys)

    def fresh(self, keys: Sequence[int], cached: int = 0) -> tuple[int, ...]:
        """The blocks of a prompt (``keys``, its first ``cached`` cached there as far as the
        index knows) that a request sent there now would compute: neither cached nor held by
        a request in flight."""
        return tuple(keys[max(cached, self.inflight_prefix(keys)) :])

    def begin(self, keys: Sequence[int], cached: int = 0) -> Flight:
        """A request with these prompt block keys was sent there, its first ``cached`` blocks
        cached there as far as the index knew; returns its :class:`Flight`."""
        keys = tuple(keys)
        fresh = self.fresh(keys, cached)
        flight = self._count(keys, fresh)
        flight.own = True
        self.sent += 1
        self.last_sent = self.wall()
        if self.waiting_since is None:
            self.waiting_since = self.last_sent
        return flight

    def adopt(self, keys: Sequence[int], fresh: Sequence[int]) -> Flight:
        """A request another router replica sent there (``shared_load``), counted with this
        router's own: its blocks are in use, its ``fresh`` blocks queued to prefill. (Silence
        and under-reporting are judged by this router's own requests only: it knows when it
        sent them and when they ended.)"""
        return self._count(tuple(keys), tuple(fresh))

    def _count(self, keys: tuple[int, ...], fresh: tuple[int, ...]) -> Flight:
        self.inflight += 1
        self.inflight_keys.update(keys)
        self.prefilling_keys.update(fresh)
        return Flight(keys, fresh, self.clock())

    def first_output(self, flight: Flight) -> None:
        """The request's first output arrived: its prefill is done (idempotent)."""
        if flight.prefilling:
            flight.prefilling = False
            _take(self.prefilling_keys, flight.fresh)

    def end(self, flight: Flight) -> None:
        """The request finished (or failed)."""
        self.first_output(flight)
        self.inflight -= 1
        self.sent -= flight.own
        _take(self.inflight_keys, flight.keys)
        took = max(self.clock() - flight.started, 0.0)
        mean = self.request_seconds
        self.request_seconds = took if mean is None else mean + _NEWEST * (took - mean)


def _take(counts: Counter[int], keys: Sequence[int]) -> None:
    """Remove one count of each of ``keys``, dropping keys that reach zero.

    One pass (``Counter.subtract`` then a sweep walked the keys twice in Python, on every
    request's end): a key at zero or below is dropped the moment it gets there, as the sweep
    after ``subtract`` dropped it."""
    for key in keys:
        left = counts.get(key, 0) - 1
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)  # dict's pop, in C (Counter's ``del`` is a Python method)
