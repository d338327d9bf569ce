"""The router core: one request's token ids in, one worker out, with the score and the reason.

Transport-free: it reads pools (``pool.Pool``, kept current by the registry) and the prefix
index, and never sends a request itself (``routed_engine`` forwards). Policies:

- ``precise``: the pool's keys for the prompt (local or remote, as the pool decided) -> the
  index's consecutive runs per ready worker -> :func:`~tokenkeys.router.policy.scorer.score_workers`
  (longest cached prefix, tier-weighted, normalized; ties by load). With the index
  unavailable (Redis down) or the keys not computable right now, the least loaded worker.
- ``round_robin``: the next ready worker in turn (the baseline without cache knowledge).
- ``text_chunks``: hashed 64-byte text chunks of the prompt matched against what this router
  sent each worker (``text_chunks``; the baseline without tokenization or events).

Decisions are counted in :class:`~tokenkeys.router.metrics.RouterMetrics`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import xxhash

from tokenkeys.errors import InvalidArgument, NotFound, TokenkeysError, Unavailable
from tokenkeys.keys import KeyContext
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.metrics import RouterMetrics
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
    blocks of the prompt are cached there according to what the policy knows.
    """

    worker: str
    model: str
    policy: str
    score: float
    matched_blocks: int
    total_blocks: int
    reason: str
    ranking: tuple[WorkerScore, ...] = ()

    def fallbacks(self) -> list[str]:
        """The other ranked workers, best first (where to retry if the chosen one fails)."""
        return [s.worker for s in self.ranking if s.worker != self.worker]


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
        metrics: RouterMetrics | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise InvalidArgument(
                f"routing policy {policy!r} is not one of {', '.join(POLICIES)}", field="policy"
            )
        self.pools = pools
        self.index = index
        self.policy = policy
        self.weights = dict(weights)
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
            decision = await self._precise(pool, request, load)
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
        self,
        pool: Pool,
        ranking: list[WorkerScore],
        total: int,
        reason: str | None,
        affinity: int | None = None,
    ) -> RouteDecision:
        # Candidates equal in score and load: always taking the lowest id would pile every new
        # prefix on one worker while loads read equal between polls. The tie goes to the
        # emptiest KV cache (to 1 %, as polled; llm-d weighs a kv-cache utilization scorer in
        # beside the prefix one), then, with ``affinity`` (the prompt's first block key), to
        # the highest hash of (affinity, worker): rendezvous hashing, so that router replicas
        # send one new prefix to the same worker before its events arrive. Without affinity
        # the remaining ties take turns.
        ties = [s for s in ranking if _key(s) == _key(ranking[0])]
        if len(ties) > 1 and reason != "round_robin":
            usage = {s.worker: round(pool.kv_usage(s.worker), 2) for s in ties}
            emptiest = min(usage.values())
            ties = [s for s in ties if usage[s.worker] == emptiest]
            if len(ties) == 1:
                chosen = ties[0]
            elif affinity is not None:
                salt = affinity.to_bytes(8, "little")
                chosen = max(ties, key=lambda s: xxhash.xxh64_intdigest(salt + s.worker.encode()))
            else:
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
        self, pool: Pool, request: RouteRequest, load: dict[str, float]
    ) -> RouteDecision:
        try:
            keys = await pool.block_keys(request.token_ids, request.context)
        except Unavailable as exc:  # remote ComputeCacheKeys unreachable: route by load
            log.warning("keys of a %s prompt unavailable: %s", pool.name, exc.message)
            return self._decide(pool, score_workers({}, 0, load), 0, "keys_unavailable")
        ids = {pool.index_id(a): a for a in load}
        reason = None
        try:
            found = await self.index.lookup(keys, ids) if keys else {}
        except TokenkeysError as exc:
            if not isinstance(exc, Unavailable):
                raise
            log.warning("prefix index unavailable, routing %s by load: %s", pool.name, exc.message)
            found, reason = {}, "index_unavailable"
        matches = {ids[w]: m for w, m in found.items() if w in ids}
        ranking = score_workers(matches, len(keys), load, weights=self.weights)
        return self._decide(pool, ranking, len(keys), reason, keys[0] if keys else None)

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
        """Drop what the text-chunk baseline remembers of a worker that left ``pool``."""
        self.text_chunks.forget(pool.index_id(address))
