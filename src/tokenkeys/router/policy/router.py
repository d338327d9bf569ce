"""The router core: one request's token ids in, one worker out, with the score and the reason.

Transport-free: it reads pools (``pool.Pool``, kept current by the registry) and asks a
:class:`~tokenkeys.router.policy.decision.Policy` which ready worker gets the request; it never
sends a request itself (``routed_engine`` forwards). The policies, each in its own module:

- ``precise`` (:mod:`~tokenkeys.router.policy.precise`): the prompt's block keys against the
  prefix index, priced by the cost model against load.
- ``round_robin`` (:mod:`~tokenkeys.router.policy.round_robin`): the next ready worker in turn
  (the baseline without cache knowledge).
- ``text_chunks`` (:mod:`~tokenkeys.router.policy.text_chunks`): hashed 64-byte text chunks of
  the prompt matched against what this router sent each worker (the baseline without
  tokenization or events).

Decisions are counted in :class:`~tokenkeys.router.metrics.RouterMetrics`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping

from tokenkeys.errors import InvalidArgument, NotFound, Unavailable
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.metrics import RouterMetrics
from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.policy.decision import Policy, RouteDecision, RouteRequest
from tokenkeys.router.policy.placement import Placements
from tokenkeys.router.policy.precise import GrowthLedgers, PrecisePolicy
from tokenkeys.router.policy.round_robin import RoundRobinPolicy
from tokenkeys.router.policy.text_chunks import TextChunksPolicy
from tokenkeys.router.workers.pool import Pool

#: Policy name -> its factory, given the prefix index, the precise policy's cost weights,
#: random source, growth ledgers and replicas' placements (the baselines need none of them).
FACTORIES: Mapping[str, Callable[..., Policy]] = {
    "precise": lambda index, **parts: PrecisePolicy(index, **parts),
    "round_robin": lambda index, **parts: RoundRobinPolicy(),
    "text_chunks": lambda index, **parts: TextChunksPolicy(),
}
POLICIES = tuple(FACTORIES)


def make_policy(
    name: str,
    index: PrefixIndex,
    *,
    cost: CostWeights | None = None,
    rng: random.Random | None = None,
    growth: GrowthLedgers | None = None,
    placements: Placements | None = None,
) -> Policy:
    """The policy called ``name``; InvalidArgument naming the known ones otherwise."""
    factory = FACTORIES.get(name)
    if factory is None:
        raise InvalidArgument(
            f"routing policy {name!r} is not one of {', '.join(POLICIES)}", field="policy"
        )
    return factory(index, cost=cost, rng=rng, growth=growth, placements=placements)


class Router:
    """Routes requests over ``pools`` (model name -> :class:`Pool`, kept current by the
    registry) with ``policy``, counting each decision in ``metrics``."""

    def __init__(
        self,
        pools: Mapping[str, Pool],
        policy: Policy,
        *,
        metrics: RouterMetrics | None = None,
    ) -> None:
        self.pools = pools
        self.policy = policy
        self.metrics = metrics if metrics is not None else RouterMetrics()

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
        """Choose a ready worker of the request's pool (of ``request.workers`` when given);
        Unavailable when none is ready.

        ``record`` False asks without acting on the answer: no metrics, and the policy does
        not remember the prompt (a dry run, ``POST /router/route``).
        """
        decision, seconds = await self.decide(request, record=record)
        if record:
            self.count(decision, seconds)
        return decision

    async def decide(
        self, request: RouteRequest, *, record: bool = True
    ) -> tuple[RouteDecision, float]:
        """:meth:`route` without its metrics: the decision and the seconds it took, for
        :meth:`count` once the request is on its way (the front door counts while the worker
        computes, not before it writes the request)."""
        pool = self.pool(request.model)
        load = pool.candidates()
        if request.workers is not None:
            load = {w: v for w, v in load.items() if w in request.workers}
        if not load:
            among = ""
            if request.workers is not None:  # e.g. those serving the LoRA adapter asked for
                among = f" among those that may serve it ({', '.join(sorted(request.workers))})"
            raise Unavailable(
                f"no ready worker serves model {pool.name!r}{among}: all are down or refused; "
                "see GET /router/workers",
                field="model",
            )
        started = time.perf_counter()
        decision = await self.policy.choose(pool, request, load, record=record)
        return decision, time.perf_counter() - started

    def count(self, decision: RouteDecision, seconds: float) -> None:
        """Count a recorded decision (:meth:`decide`) that took ``seconds``."""
        m, name, model = self.metrics, self.policy.name, decision.model
        m.route_seconds_of[(name,)].observe(seconds)
        m.decisions_of[(model, name, decision.reason)].inc()
        m.score_of[(model, name)].observe(decision.score)
        m.prompt_blocks_of[(model,)].inc(decision.total_blocks)
        m.matched_blocks_of[(model,)].inc(decision.matched_blocks)

    def forget(self, pool: Pool, address: str) -> None:
        """Drop what the policy remembers of a worker that left ``pool``."""
        self.policy.forget(pool, address)
