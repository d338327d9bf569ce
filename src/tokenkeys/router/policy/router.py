"""The router core: one request's token ids in, one worker out, with the score and the reason.

Transport-free: it reads pools (``pool.Pool``, kept current by the registry) and the prefix
index, and never sends a request itself (``routed_engine`` forwards). Policies:

- ``precise``: the pool's keys for the prompt (local or remote, as the pool decided) -> the
  index's consecutive runs per ready worker, cut for a hybrid model to what the engine resumes
  (``index.hybrid``) -> :func:`~tokenkeys.router.policy.scorer.score_workers`
  (longest cached prefix, tier-weighted, normalized) -> :func:`~tokenkeys.router.policy.cost.
  cost_workers` (blocks to prefill against the load there, blocks beyond its KV capacity and
  recent cache growth, weighted by :class:`~tokenkeys.router.policy.cost.CostWeights`) -> the
  cheapest worker. The index missing (Redis down) or the keys not computable right now leave
  load and growth to decide.
- ``round_robin``: the next ready worker in turn (the baseline without cache knowledge).
- ``text_chunks``: hashed 64-byte text chunks of the prompt matched against what this router
  sent each worker (``text_chunks``; the baseline without tokenization or events).

Decisions are counted in :class:`~tokenkeys.router.metrics.RouterMetrics`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tokenkeys.errors import InvalidArgument, NotFound, TokenkeysError, Unavailable
from tokenkeys.keys import KeyContext
from tokenkeys.router.index.hybrid import resumable_matches
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.metrics import RouterMetrics
from tokenkeys.router.policy.cost import Candidate, CostWeights, GrowthLedger, choose, cost_workers
from tokenkeys.router.policy.scorer import DEFAULT_TIER_WEIGHTS, WorkerScore, score_workers
from tokenkeys.router.policy.text_chunks import TextChunkTable, chunk_hashes
from tokenkeys.router.workers.pool import Pool

log = logging.getLogger(__name__)

POLICIES = ("precise", "round_robin", "text_chunks")


@dataclass(frozen=True)
class RouteRequest:
    """What routing needs of a request: its model, prompt ids and key context.

    ``text`` is used by the ``text_chunks`` policy only (default: the decoded prompt).
    """

    token_ids: Sequence[int]
    model: str | None = None
    context: KeyContext | None = None
    text: str | None = None


@dataclass(frozen=True)
class RouteDecision:
    """The chosen worker (its address), why, and the ranking it was chosen from (best first).

    ``score`` is the chosen worker's in [0, 1]; ``matched_blocks`` of ``total_blocks`` full
    blocks of the prompt are cached there according to what the policy knows. ``keys`` are the
    prompt's block keys (precise policy), which the forwarder counts as in flight there.
    """

    worker: str
    model: str
    policy: str
    score: float
    matched_blocks: int
    total_blocks: int
    reason: str
    ranking: tuple[WorkerScore, ...] = ()
    keys: tuple[int, ...] = ()

    def fallbacks(self) -> list[str]:
        """The other ranked workers, best first (where to retry if the chosen one fails)."""
        return [s.worker for s in self.ranking if s.worker != self.worker]

    def cached_blocks(self, worker: str) -> int:
        """Leading blocks of the prompt the policy found cached at ``worker`` (0 if unranked)."""
        return next((s.matched_blocks for s in self.ranking if s.worker == worker), 0)


def _key(score: WorkerScore) -> tuple[float, float]:
    return round(score.score, 12), score.load


class Router:
    """Routes requests over ``pools`` (model name -> :class:`Pool`, kept current by the
    registry) with ``policy``; ``index`` is the prefix index the pools' events feed."""

    def __init__(
        self,
        pools: Mapping[str, Pool],
        index: PrefixIndex,
        *,
        policy: str = "precise",
        weights: Mapping[str, float] = DEFAULT_TIER_WEIGHTS,
        cost: CostWeights | None = None,
        metrics: RouterMetrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise InvalidArgument(
                f"routing policy {policy!r} is not one of {', '.join(POLICIES)}", field="policy"
            )
        self.pools = pools
        self.index = index
        self.policy = policy
        self.weights = dict(weights)
        self.cost = cost if cost is not None else CostWeights()
        # Only sampling (temperature > 0) draws from it; seeded for reproducible runs.
        self.rng = rng if rng is not None else random.Random()
        self._growth: dict[str, GrowthLedger] = {}
        self.metrics = metrics if metrics is not None else RouterMetrics()
        self._turn: dict[object, itertools.count] = {}
        self.text_chunks = TextChunkTable()

    def pool(self, model: str | None) -> Pool:
        """The pool of ``model`` (None or "": the only pool, or the first discovered)."""
        if not self.pools:
            raise Unavailable(
                "no worker has been admitted yet, so no model can be routed; check the "
                "--worker addresses and GET /router/workers for refusals",
                field="model",
            )
        if not model:
            return next(iter(self.pools.values()))
        pool = self.pools.get(model)
        if pool is None:
            raise NotFound(
                f"model {model!r} is not served by any admitted worker; models: "
                f"{', '.join(self.pools)}",
                field="model",
                served=list(self.pools),
            )
        return pool

    async def route(self, request: RouteRequest, *, record: bool = True) -> RouteDecision:
        """Choose a ready worker of the request's pool; Unavailable when none is ready.

        ``record`` False asks without acting on the answer: no metrics, and the text-chunk
        baseline does not remember the prompt (a dry run, ``POST /router/route``).
        """
        pool = self.pool(request.model)
        load = pool.candidates()
        if not load:
            raise Unavailable(
                f"no ready worker serves model {pool.name!r}: all are down or refused; see "
                "GET /router/workers",
                field="model",
            )
        started = time.perf_counter()
        if self.policy == "precise":
            decision = await self._precise(pool, request, load, record)
        elif self.policy == "round_robin":
            decision = self._round_robin(pool, load)
        else:
            decision = self._text_chunks(pool, request, load, record)
        if not record:
            return decision
        m = self.metrics
        m.route_seconds.labels(self.policy).observe(time.perf_counter() - started)
        m.decisions.labels(pool.name, self.policy, decision.reason).inc()
        m.score.labels(pool.name, self.policy).observe(decision.score)
        m.prompt_blocks.labels(pool.name).inc(decision.total_blocks)
        m.matched_blocks.labels(pool.name).inc(decision.matched_blocks)
        return decision

    def _decide(
        self, pool: Pool, ranking: list[WorkerScore], total: int, reason: str | None
    ) -> RouteDecision:
        """The baselines' decision: the first of ``ranking``, equal candidates taking turns."""
        # Candidates equal in score and load: always taking the lowest id would pile every new
        # prefix on one worker while loads read equal between polls. The tie goes to the
        # emptiest KV cache (to 1 %, as polled), then the remaining ties take turns.
        ties = [s for s in ranking if _key(s) == _key(ranking[0])]
        if len(ties) > 1 and reason != "round_robin":
            usage = {s.worker: round(pool.kv_usage(s.worker), 2) for s in ties}
            emptiest = min(usage.values())
            ties = [s for s in ties if usage[s.worker] == emptiest]
            turn = next(self._turn.setdefault(("ties", pool.name), itertools.count()))
            chosen = ties[turn % len(ties)]
            ranking = [chosen, *(s for s in ranking if s is not chosen)]
        best = ranking[0]
        if reason is None:
            reason = "prefix" if best.matched_blocks else "load"
        return RouteDecision(
            worker=best.worker,
            model=pool.name,
            policy=self.policy,
            score=best.score,
            matched_blocks=best.matched_blocks,
            total_blocks=total,
            reason=reason,
            ranking=tuple(ranking),
        )

    async def _precise(
        self, pool: Pool, request: RouteRequest, load: dict[str, float], record: bool
    ) -> RouteDecision:
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
        growth = self._growth.setdefault(pool.name, GrowthLedger())
        loads = {}
        prompt_keys: frozenset[int] = frozenset()  # built once, when a worker has prefill queued
        for address in load:
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
        costs = choose(
            cost_workers(scores, total, loads, self.cost),
            self.cost.temperature,
            affinity=keys[0] if keys else None,
            rng=self.rng,
        )
        best = costs[0]
        if record:
            growth.record(best.worker, best.prefill_blocks)
        if reason is None:
            reason = "prefix" if best.prefill_blocks < total else "load"
            if best.worker in untrusted:
                reason = "keys_unverified"  # routed by load: say why in the decision metrics
        ranking = tuple(dataclasses.replace(c.score, cost=c.cost) for c in costs)
        return RouteDecision(
            worker=best.worker,
            model=pool.name,
            policy=self.policy,
            score=best.score.score,
            matched_blocks=best.score.matched_blocks,
            total_blocks=total,
            reason=reason,
            ranking=ranking,
            keys=tuple(keys),
        )

    def _round_robin(self, pool: Pool, load: dict[str, float]) -> RouteDecision:
        order = sorted(load)
        turn = next(self._turn.setdefault(pool.name, itertools.count()))
        chosen = order[turn % len(order)]
        ranking = [WorkerScore(chosen, 0.0, 0, load[chosen])]
        rest = sorted((w for w in load if w != chosen), key=lambda w: (load[w], w))
        ranking += [WorkerScore(w, 0.0, 0, load[w]) for w in rest]
        return self._decide(pool, ranking, 0, "round_robin")

    def _text_chunks(
        self, pool: Pool, request: RouteRequest, load: dict[str, float], record: bool
    ) -> RouteDecision:
        text = request.text
        if text is None:
            text = pool.preprocessor.detokenize([list(request.token_ids)], field_name="prompt")[0]
        hashes = chunk_hashes(text, pool.name)
        ids = {pool.index_id(a): a for a in load}
        found = self.text_chunks.lookup(hashes, ids)
        matches = {ids[w]: m for w, m in found.items()}
        ranking = score_workers(matches, len(hashes), load)
        decision = self._decide(pool, ranking, len(hashes), None)
        if record:
            self.text_chunks.record(pool.index_id(decision.worker), hashes)
        reason = "text_prefix" if decision.matched_blocks else "load"
        return dataclasses.replace(decision, reason=reason)

    def forget(self, pool: Pool, address: str) -> None:
        """Drop what the text-chunk baseline and the cost model remember of a worker that left."""
        self.text_chunks.forget(pool.index_id(address))
        growth = self._growth.get(pool.name)
        if growth is not None:
            growth.forget(address)
