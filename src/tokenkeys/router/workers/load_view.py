"""What one router knows of one worker's load: its last GetLoad, and its own requests there.

A poll is a snapshot, up to a poll interval old, and a burst of requests is routed faster than
any poll. So the router counts what it sent: the requests it has in flight at the worker and
their prompt block keys (as Dynamo's router tracks its active sequences per worker,
ai-dynamo/dynamo ``lib/llm/src/kv_router/sequence.rs``). The worker's blocks in use are then
estimated as other clients' share of the last snapshot, fading as it ages (other clients'
requests finish too: with the time constant of this router's own requests there, the best
guess it has), plus its own in-flight blocks now.

The same counts check the worker (``trust``): one that reports fewer requests than this router
has in flight there is not believed (:attr:`LoadView.load` takes the larger), and the polls
that did so are counted; requests sent since its last event batch tell a silent worker.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# Weight of the newest request in the running mean of request durations.
_NEWEST = 0.2


@dataclass
class LoadView:
    """The router's view of one worker's load (see the module doc). ``clock``: seconds."""

    clock: Callable[[], float] = time.monotonic
    #: From the last GetLoad: running + queued requests, fraction of KV blocks in use, KV blocks
    #: referenced by running requests; when it arrived and how many blocks were this router's.
    polled_load: float = 0.0
    kv_usage: float = 0.0
    used_kv_blocks: int = 0
    polled_at: float = 0.0
    own_blocks_at_poll: int = 0
    #: This router's requests in flight there, and their prompts' block keys (one count per
    #: request using a key).
    inflight: int = 0
    inflight_keys: Counter[int] = field(default_factory=Counter)
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

    def polled(self, running_and_queued: float, kv_usage: float, used_kv_blocks: int) -> None:
        """Take a GetLoad answer."""
        self.polled_load = running_and_queued
        self.kv_usage = kv_usage
        self.used_kv_blocks = used_kv_blocks
        self.polled_at = self.clock()
        self.own_blocks_at_poll = self.own_blocks
        if running_and_queued < self.inflight:
            self.underreports += 1
            self.last_claim = (running_and_queued, self.inflight)
        else:
            self.underreports = 0

    def events_applied(self, applied_at: float | None) -> None:
        """The worker's last event batch was applied at ``applied_at`` (``wall`` time)."""
        if applied_at is None or self.waiting_since is None or applied_at < self.waiting_since:
            return
        # Requests sent after that batch are still waiting for theirs; the last one sent is
        # the latest of them (an estimate on the late side: silence is never overstated).
        sent = self.last_sent
        self.waiting_since = sent if sent is not None and sent > applied_at else None

    def inflight_prefix(self, keys: Sequence[int]) -> int:
        """How many leading ``keys`` this router's in-flight requests there reference."""
        held = self.inflight_keys
        n = 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n

    def begin(self, keys: Sequence[int]) -> float:
        """A request with these prompt block keys was sent there; returns its start time."""
        self.inflight += 1
        self.inflight_keys.update(keys)
        self.last_sent = self.wall()
        if self.waiting_since is None:
            self.waiting_since = self.last_sent
        return self.clock()

    def end(self, keys: Sequence[int], started: float) -> None:
        """The request that :meth:`begin` returned ``started`` for finished (or failed)."""
        self.inflight -= 1
        self.inflight_keys.subtract(keys)
        for key in keys:
            if self.inflight_keys[key] <= 0:
                del self.inflight_keys[key]
        took = max(self.clock() - started, 0.0)
        mean = self.request_seconds
        self.request_seconds = took if mean is None else mean + _NEWEST * (took - mean)
