"""What router replicas deciding at the same instant get wrong, counted instead of hidden.

A replica decides on its own memory at once and tells its peers afterwards
(``router.replicas.shared_load``), so two replicas may each decide without the other's
placement. Every placement a replica appends carries the stream position it had applied
when it decided (``seen``). When this replica applies a peer's placement it knows exactly
which of its own placements the peer had not seen (appended after ``seen``, or not appended
yet) and which of the peer's it had not seen itself (all it had not applied before deciding):
those pairs were decided *concurrently*, each without the other. Of those pairs it counts
the two kinds one router would have decided differently:

- ``split``: the two prompts open with the same blocks, went to different workers, and both
  prefill those shared blocks there: a prefix computed twice, which one router avoids (its
  second request sees the first's blocks in flight and follows them, ``LoadView.inflight_prefix``).
  ``split_blocks`` counts the blocks computed twice.
- ``piled``: two new prompts (nothing of either cached or in flight where it went: it
  prefills from its first block) sharing no leading block went to the same worker, each
  priced without the other's growth (``GrowthLedger``): one router would have priced the
  first and may have spread the second elsewhere. (May: the cost model could still choose
  the same worker; this is the upper bound of what was missed.)

Each pair is counted once, by the replica whose own entry came first in the stream, when it
applies the later one (the other replica, applying the earlier, skips it); the counts of all
replicas added together are the pool's. A replica keeps its own placements of
the last ``window`` seconds to compare (a peer's placement older than that, still unseen, is
a peer far behind: its flights expire anyway).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenkeys.router.replicas.shared_stream import entry_id


@dataclass
class OwnPlacement:
    """One of this replica's placements as told: where, which prompt, what it prefills."""

    model: str
    worker: str
    keys: tuple[int, ...]
    fresh: frozenset[int]
    decided: float
    #: Its stream entry (``(ms, seq)``), once appended; None until then.
    at: tuple[int, int] | None = None


class Contention:
    """Counts concurrent decisions of this replica and its peers (module doc)."""

    def __init__(self, window: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self._own: deque[OwnPlacement] = deque()
        #: Peers' placements decided without one of this replica's (and it without theirs).
        self.concurrent = 0
        #: Of those pairs, prefixes placed on two workers and computed twice, and their blocks.
        self.split = 0
        self.split_blocks = 0
        #: Of those pairs, unrelated prompts both growing one worker's cache.
        self.piled = 0

    def decided(
        self, model: str, worker: str, keys: Sequence[int], fresh: Sequence[int]
    ) -> OwnPlacement:
        """This replica placed a prompt; returns its record, :meth:`appended` later."""
        own = OwnPlacement(model, worker, tuple(keys), frozenset(fresh), self.clock())
        self._own.append(own)
        self._prune()
        return own

    def appended(self, placements: Sequence[OwnPlacement], raw_id: bytes | str) -> None:
        """These placements reached the stream as entry ``raw_id``."""
        at = entry_id(raw_id)
        for own in placements:
            own.at = at

    def peer_placed(
        self,
        model: str,
        worker: str,
        keys: Sequence[int],
        fresh: Sequence[int],
        seen: bytes | str,
        at: tuple[int, int],
    ) -> int:
        """A peer's placement (stream entry ``at``), decided having applied the stream up to
        ``seen``, is applied here now: counts and returns how many of this replica's
        placements it contends with.

        Every own placement still kept was decided before this moment, so before this
        replica knew of the peer's; the peer knew of it only if its entry is at or before
        ``seen``. Own placements appended after ``at`` (or not yet) are the peer's to count.
        """
        self._prune()
        upto = entry_id(seen) if seen else (0, 0)
        fresh_set = frozenset(fresh)
        contended = 0
        # Own placements are appended in order: from the newest back, those not appended yet
        # and those after ``at`` are skipped, and the first at or before ``seen`` ends the
        # scan, so it visits the concurrent ones only (not the whole window at a high rate).
        for own in reversed(self._own):
            if own.at is None or own.at >= at:
                continue
            if own.at <= upto:
                break
            if own.model != model:
                continue
            contended += 1
            self.concurrent += 1
            shared = _common_prefix(own.keys, keys)
            if shared and own.worker != worker:
                twice = sum(1 for k in keys[:shared] if k in fresh_set and k in own.fresh)
                if twice:
                    self.split += 1
                    self.split_blocks += twice
            elif not shared and own.worker == worker and _new(own.keys, own.fresh, keys, fresh):
                self.piled += 1
        return contended

    def _prune(self) -> None:
        oldest = self.clock() - self.window
        while self._own and self._own[0].decided < oldest:
            self._own.popleft()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _new(
    a: Sequence[int], a_fresh: frozenset[int], b: Sequence[int], b_fresh: Sequence[int]
) -> bool:
    """Both prompts are new where they went: each prefills from its first block."""
    return bool(a and b and b_fresh) and a[0] in a_fresh and b[0] == b_fresh[0]
