"""How a decision is placed when several router replicas route one pool.

A decision reads only this router's memory (its load views, growth ledgers). Replicas behind
one load balancer route a burst at the same moment, each on its own memory. A
:class:`Placements` runs the decision (``decide``, pure local computation, the cost model and
all) and keeps what it placed (worker, prompt, growth) for the other replicas: the Redis one
(``router.replicas.shared_load.RedisSharedLoad``) tells them asynchronously, with the request,
and never waits for them. So the cost model exists once, here in Python, and a decision costs
what it costs one router; what replicas deciding at the same instant miss of each other is
measured there (``router.replicas.contention``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


@dataclass(frozen=True)
class Home:
    """Where a prompt moved after its decision went (``worker``), the worker its first attempt
    left (``left``), and how many of its blocks ``left`` held before that attempt (``kept``):
    the rest it holds only from the attempt moved away (``router.replicas.reconcile``)."""

    worker: str
    left: str
    kept: int


class Placements(Protocol):
    """Runs decisions and keeps their placements for the other router replicas."""

    #: Whether other router replicas decide beside this one (a prompt new everywhere then
    #: goes by rendezvous within the cost model's slack, ``router.policy.cost``).
    replicated: bool
    #: Whether a later copy of a new prompt moves to its earlier copy's worker
    #: (``router.replicas.reconcile``): a prompt new everywhere then goes to the cheapest
    #: worker, as one router's does, without the slack; the split that may follow is undone.
    reconciles: bool

    def home(self, model: str, keys: Sequence[int], blocks: int) -> Home | None:
        """Where the longest prompt moved after its decision whose blocks are a prefix of the
        first ``blocks`` of ``keys`` went, and what the worker it left held of it before.
        None: no such move known."""
        ...

    async def place(self, decide: Callable[[], tuple[Placement, T]]) -> T:
        """Run ``decide`` (local, no awaits) once; its result.

        When it returns, the placement is this router's to act on at once (before its next
        await): its growth recorded, its request sent.
        """
        ...


class LocalPlacements:
    """One router: every decision stands as made."""

    replicated = False
    reconciles = False

    def home(self, model: str, keys: Sequence[int], blocks: int) -> Home | None:
        """Never: one router moves nothing after its decision."""
        return None

    async def place(self, decide: Callable[[], tuple[Placement, T]]) -> T:
        """``decide``'s result, once."""
        return decide()[1]
