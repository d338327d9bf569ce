"""The ``precise`` policy: the prompt's own block keys against what each worker has cached.

The pool's keys for the prompt (local or remote, as the pool decided) -> the index's
consecutive runs per ready worker -> :func:`~tokenkeys.router.policy.scorer.score_workers`
(longest cached prefix, tier-weighted, normalized) -> :func:`~tokenkeys.router.policy.cost.
cost_workers` (blocks to prefill against the load there, blocks beyond its KV capacity and
recent cache growth, weighted by :class:`~tokenkeys.router.policy.cost.CostWeights`) -> the
cheapest worker. The index missing (Redis down) or the keys not computable right now leave
load and growth to decide. The last two steps read only this router's memory; with router
replicas sharing their load they run inside :meth:`~tokenkeys.router.policy.placement.
Placements.place`, which keeps what they placed for the peers (``router.policy.placement``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping

from tokenkeys.errors import TokenkeysError, Unavailable
from tokenkeys.router.index.hybrid import resumable_matches
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.policy.cost import (
    Candidate,
    CostWeights,
    GrowthLedger,
    WorkerCost,
    choose,
    cost_workers,
    replica_slack,
)
from tokenkeys.router.policy.decision import RouteDecision, RouteRequest
from tokenkeys.router.policy.placement import LocalPlacements, Placement, Placements
from tokenkeys.router.policy.scorer import DEFAULT_TIER_WEIGHTS, WorkerScore, score_workers
from tokenkeys.router.workers.pool import Pool

log = logging.getLogger(__name__)


class GrowthLedgers:
    """Each pool's :class:`~tokenkeys.router.policy.cost.GrowthLedger`, by model name; the
    routing service owns them, so what else counts growth (router replicas sharing their load)
    reads the same ledgers the policy prices."""

    def __init__(self) -> None:
        self._ledgers: dict[str, GrowthLedger] = {}

    def ledger(self, model: str) -> GrowthLedger:
        """The growth counted for the pool of ``model``."""
        return self._ledgers.setdefault(model, GrowthLedger())

    def record(self, model: str, worker: str, new_blocks: float) -> None:
        """A decision put ``new_blocks`` into ``worker``'s cache."""
        self.ledger(model).record(worker, new_blocks)

    def forget(self, model: str, worker: str) -> None:
        """Drop the growth counted for ``worker``, which left the pool of ``model``."""
        ledger = self._ledgers.get(model)
        if ledger is not None:
            ledger.forget(worker)


class PrecisePolicy:
    """Routes by the prefix ``index`` the pools' events feed, pricing cache ``growth``
    (default: its own :class:`GrowthLedgers`); ``placements`` keeps each decision's placement
    for the other router replicas (default: none, one router)."""

    name = "precise"

    def __init__(
        self,
        index: PrefixIndex,
        *,
        weights: Mapping[str, float] = DEFAULT_TIER_WEIGHTS,
        cost: CostWeights | None = None,
        rng: random.Random | None = None,
        growth: GrowthLedgers | None = None,
        placements: Placements | None = None,
    ) -> None:
        self.index = index
        self.weights = dict(weights)
        self.cost = cost if cost is not None else CostWeights()
        # Only sampling (temperature > 0) draws from it; seeded for reproducible runs.
        self.rng = rng if rng is not None else random.Random()
        self.growth = growth if growth is not None else GrowthLedgers()
        self.placements = placements if placements is not None else LocalPlacements()

    async def choose(
        self, pool: Pool, request: RouteRequest, load: Mapping[str, float], *, record: bool
    ) -> RouteDecision:
        """The cheapest worker by the cost model; ``record`` adds its growth to the ledger."""
        reason = None
        try:
            keys = await pool.block_keys(request.token_ids, request.context)
        except Unavailable as exc:  # remote ComputeCacheKeys unreachable: route by load
            log.warning("keys of a %s prompt unavailable: %s", pool.name, exc.message)
            keys, reason = [], "keys_unavailable"
        ids = {pool.index_id(a): a for a in load}
        try:
            found = (
                await resumable_matches(self.index, keys, len(request.token_ids), pool.layout, ids)
                if keys
                else {}
            )
        except TokenkeysError as exc:
            if not isinstance(exc, Unavailable):
                raise
            log.warning("prefix index unavailable, routing %s by load: %s", pool.name, exc.message)
            found, reason = {}, "index_unavailable"
        # A worker advertising unverified keys: its prefix matches are not believed.
        untrusted = pool.untrusted()
        matches = {ids[w]: m for w, m in found.items() if w in ids and ids[w] not in untrusted}
        # Without keys the prompt's size still weighs in the load and growth it brings.
        total = len(keys) if keys else len(request.token_ids) // pool.block_size
        scores = score_workers(matches, total, load, weights=self.weights)
        growth = self.growth.ledger(pool.name)

        def decide() -> tuple[Placement, list[WorkerCost]]:
            """The cost of every worker on this router's memory now, cheapest first."""
            # Peers are heard between two calls: a worker may have left the pool meanwhile.
            live = [s for s in scores if s.worker in pool.members]
            if not live:
                raise Unavailable(
                    f"every ready worker of {pool.name!r} left while routing; see "
                    "GET /router/workers",
                    field="model",
                )
            loads = {}
            prompt_keys: frozenset[int] = frozenset()  # built once, when prefill is queued
            for s in live:
                address = s.worker
                view = pool.members[address].view
                if view.prefilling_keys and not prompt_keys:
                    prompt_keys = frozenset(keys)
                loads[address] = Candidate(
                    active_blocks=view.active_blocks,
                    inflight_prefix=view.inflight_prefix(keys),
                    growth=growth.get(address),
                    queued_prefill=view.queued_prefill(prompt_keys),
                    capacity=view.capacity,
                )
            costs = cost_workers(live, total, loads, self.cost)
            # Alone, a router sees every decision it makes and takes the cheapest; beside
            # peers, within the slack the prefix and then the rendezvous hash decide, which
            # every replica knows alike (router.policy.cost).
            slack = replica_slack(total, self.cost) if self.placements.replicated else 0
            if (
                slack
                and self.placements.reconciles
                and all(c.prefill_blocks >= total for c in costs)
            ):
                # New everywhere: balanced by cost as one router's; where two replicas part
                # on it, the later copy is moved after the decision (router.replicas.reconcile).
                slack = 0
            costs = choose(
                costs,
                self.cost.temperature,
                affinity=keys[0] if keys else None,
                slack=slack,
                rng=self.rng,
            )
            best = costs[0]
            fresh = pool.members[best.worker].view.fresh(keys, best.score.matched_blocks)
            return Placement(pool.name, best.worker, tuple(keys), fresh, best.prefill_blocks), costs

        if record:
            costs = await self.placements.place(decide)
            best = costs[0]
            # At once, before any await: the next decision prices this one's growth.
            self.growth.record(pool.name, best.worker, best.prefill_blocks)
        else:
            costs = decide()[1]
            best = costs[0]
        if reason is None:
            reason = "prefix" if best.prefill_blocks < total else "load"
            if best.worker in untrusted:
                reason = "keys_unverified"  # routed by load: say why in the decision metrics
        # Each score with its cost, as dataclasses.replace(c.score, cost=c.cost) makes it
        # (without replace's walk over the fields on every call).
        ranking = [
            WorkerScore(s.worker, s.score, s.matched_blocks, s.load, c.cost)
            for c in costs
            for s in (c.score,)
        ]
        return RouteDecision.first_of(
            ranking, model=pool.name, policy=self.name, total_blocks=total, reason=reason, keys=keys
        )

    def forget(self, pool: Pool, address: str) -> None:
        """Drop the growth the cost model remembers of ``address``."""
        self.growth.forget(pool.name, address)
