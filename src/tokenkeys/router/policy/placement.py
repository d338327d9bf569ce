"""How a decision is placed when several router replicas route one pool: decided, then agreed.

A decision reads only this router's memory (its load views, growth ledgers). Replicas behind
one load balancer route a burst at the same moment, each on its own memory, so without more
two of them send two new prefixes to the one worker that looked idle to both. A
:class:`Placements` closes that window: it runs the decision (``decide``, pure local
computation, the cost model and all) and then agrees on it with the other replicas. The
Redis one (``router.replicas.shared_load.RedisSharedLoad``) does so in one atomic round trip that
records the placement only if no peer recorded one since this replica last looked, and
otherwise hands back what the peers recorded, so the decision is made again with it
(optimistic, bounded retries). The cost model therefore exists once, here in Python; the
store only orders placements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Placement:
    """What a decision puts on ``worker`` of ``model``'s pool: a request with the prompt's
    block ``keys`` (of which it prefills ``fresh`` there) and ``growth`` new cache blocks."""

    model: str
    worker: str
    keys: tuple[int, ...]
    fresh: tuple[int, ...]
    growth: float


class Placements(Protocol):
    """Agrees on decisions with other router replicas (see the module doc)."""

    async def place(self, decide: Callable[[], tuple[Placement, T]]) -> T:
        """Run ``decide`` (local, no awaits) until its placement is agreed; its last result.

        ``decide`` is called again after peers' placements were applied to this router's
        memory. Several calls may be agreeing at once: each decision made meanwhile sees the
        placements still being agreed as this router's own (held in its memory). When it
        returns, the placement is this router's to act on at once (before its next await):
        its growth recorded, its request sent.
        """
        ...


class LocalPlacements:
    """One router: every decision stands as made."""

    async def place(self, decide: Callable[[], tuple[Placement, T]]) -> T:
        """``decide``'s result, once."""
        return decide()[1]
