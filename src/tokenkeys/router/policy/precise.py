"""The ``precise`` policy: the prompt's own block keys against what each worker has cached.

The pool's keys for the prompt (local or remote, as the pool decided) -> the index's
consecutive runs per ready worker -> :func:`~tokenkeys.router.policy.scorer.score_workers`
(longest cached prefix, tier-weighted, normalized) -> :func:`~tokenkeys.router.policy.cost.
cost_workers` (blocks to prefill against the load there, blocks beyond its KV capacity and
recent cache growth, weighted by :class:`~tokenkeys.router.policy.cost.CostWeights`) -> the
cheapest worker; the last three steps are one call, :func:`~tokenkeys.router.policy.ranking.
rank` (in C where built, bit-identical to the Python path). The index missing (Redis down) or
the keys not computable right now leave load and growth to decide. The last two steps read
only this router's memory; with router replicas sharing their load they run inside
:meth:`~tokenkeys.router.policy.placement.Placements.place`, which keeps what they placed for
the peers (``router.policy.placement``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping

from tokenkeys.errors import TokenkeysError, Unavailable
from tokenkeys.router.index.hybrid import resumable_matches
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.policy.cost import CostWeights, GrowthLedger, replica_slack, within_slack
from tokenkeys.router.policy.decision import RouteDecision, RouteRequest
from tokenkeys.router.policy.placement import LocalPlacements, Placement, Placements
from tokenkeys.router.policy.ranking import rank
from tokenkeys.router.policy.scorer import DEFAULT_TIER_WEIGHTS, WorkerScore
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
        growth = self.growth.ledger(pool.name)

        def decide() -> tuple[Placement, tuple[list[WorkerScore], float]]:
            """Every worker ranked on this router's memory now (cheapest first, each score with
            its cost), and the first one's blocks to prefill."""
            # Peers are heard between two calls: a worker may have left the pool meanwhile.
            members = pool.members
            rows = []
            prompt_keys: frozenset[int] = frozenset()  # built once, when prefill is queued
            for address, worker_load in load.items():
                member = members.get(address)
                if member is None:
                    continue
                view = member.view
                queued = 0  # nothing in flight or in prefill there: both walks are 0
                if view.prefilling_keys:
                    if not prompt_keys:
                        prompt_keys = frozenset(keys)
                    queued = view.queued_prefill(prompt_keys)
                match = matches.get(address)
                rows.append(
                    (
                        address,
                        worker_load,
                        None if match is None else match.segments,
                        view.active_blocks,
                        view.inflight_prefix(keys) if view.inflight_keys else 0,
                        growth.get(address),
                        queued,
                        view.capacity,
                    )
                )
            if not rows:
                raise Unavailable(
                    f"every ready worker of {pool.name!r} left while routing; see "
                    "GET /router/workers",
                    field="model",
                )
            # Alone, a router sees every decision it makes and takes the cheapest; beside
            # peers, within the slack the prefix and then the rendezvous hash decide, which
            # every replica knows alike (router.policy.cost).
            slack = replica_slack(total, self.cost) if self.placements.replicated else 0
            if (
                slack
                and self.placements.reconciles
                and all(row[2] is None and not row[4] for row in rows)
            ):
                # New everywhere (no worker holds a block of it or has one in flight):
                # balanced by cost as one router's; where two replicas part on it, the later
                # copy is moved after the decision (router.replicas.reconcile).
                slack = 0
            ranked = rank(
                rows,
                total,
                self.weights,
                self.cost,
                affinity=keys[0] if keys else None,
                slack=slack,
                rng=self.rng,
            )
            if slack and ranked[0][0].matched_blocks:
                ranked = at_home(ranked, self.placements, pool.name, keys, slack, self.cost.prefix)
            best, prefill = ranked[0][0], ranked[1]
            fresh = members[best.worker].view.fresh(keys, best.matched_blocks)
            return Placement(pool.name, best.worker, tuple(keys), fresh, prefill), ranked

        if record:
            ranking, prefill = await self.placements.place(decide)
            # At once, before any await: the next decision prices this one's growth.
            self.growth.record(pool.name, ranking[0].worker, prefill)
        else:
            ranking, prefill = decide()[1]
        if reason is None:
            reason = "prefix" if prefill < total else "load"
            if ranking[0].worker in untrusted:
                reason = "keys_unverified"  # routed by load: say why in the decision metrics
        return RouteDecision.first_of(
            ranking, model=pool.name, policy=self.name, total_blocks=total, reason=reason, keys=keys
        )

    def forget(self, pool: Pool, address: str) -> None:
        """Drop the growth the cost model remembers of ``address``."""
        self.growth.forget(pool.name, address)


def at_home(
    ranked: tuple[list[WorkerScore], float],
    placements: Placements,
    model: str,
    keys: list[int],
    slack: float,
    prefix: float,
) -> tuple[list[WorkerScore], float]:
    """``ranked`` with the worker a moved prompt went to first (``Placements.home``), when it
    holds at least as much of this prompt as the first and costs at most ``slack`` more than
    the cheapest, the worker the prompt left priced without the blocks the moved attempt left
    there (``prefix`` each). Within the slack the prefix and then the rendezvous hash decide;
    a prompt moved after its decision is cached as far on the worker it left (its first
    attempt ran there), and the hash alone would send its next turn back there half the time,
    a replica's view of the load in a burst more often, which the conversation's history then
    grows on twice. One router never made that attempt: it would price the worker left by
    what it held before."""
    ranking, prefill = ranked
    first = ranking[0]
    # Only a worker holding at least as much as the first may go before it.
    rivals = [s.matched_blocks for s in ranking[1:] if s.matched_blocks >= first.matched_blocks]
    if not rivals:
        return ranked
    home = placements.home(model, keys, max(rivals))
    if home is None or home.worker == first.worker:
        return ranked
    there = next((s for s in ranking if s.worker == home.worker), None)
    if there is None or there.cost is None or there.matched_blocks < first.matched_blocks:
        return ranked
    left, kept = home.left, home.kept
    cheapest = min(
        s.cost + (prefix * max(s.matched_blocks - kept, 0) if s.worker == left else 0.0)
        for s in ranking
        if s.cost is not None
    )
    if not within_slack(there.cost, cheapest, slack):
        return ranked
    return [there, *(s for s in ranking if s is not there)], prefill
