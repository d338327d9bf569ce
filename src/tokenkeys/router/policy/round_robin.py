"""The ``round_robin`` policy: the next ready worker in turn (no cache knowledge)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from tokenkeys.router.policy.decision import RouteDecision, RouteRequest
from tokenkeys.router.policy.scorer import WorkerScore
from tokenkeys.router.workers.pool import Pool


class RoundRobinPolicy:
    """Each pool's ready workers in address order, one turn each; the rest ranked by load."""

    name = "round_robin"

    def __init__(self) -> None:
        self._turn: dict[str, itertools.count[int]] = {}

    async def choose(
        self, pool: Pool, request: RouteRequest, load: Mapping[str, float], *, record: bool
    ) -> RouteDecision:
        """The next worker in turn (a dry run takes a turn too: the turn is not a cache)."""
        order = sorted(load)
        turn = next(self._turn.setdefault(pool.name, itertools.count()))
        chosen = order[turn % len(order)]
        rest = sorted((w for w in load if w != chosen), key=lambda w: (load[w], w))
        ranking = [WorkerScore(w, 0.0, 0, load[w]) for w in (chosen, *rest)]
        return RouteDecision.first_of(
            ranking, model=pool.name, policy=self.name, total_blocks=0, reason="round_robin"
        )

    def forget(self, pool: Pool, address: str) -> None:
        """Nothing to forget: the turn is over whoever is ready now."""
