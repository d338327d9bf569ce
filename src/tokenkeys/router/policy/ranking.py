"""The precise policy's ranking: every candidate's score and cost, best first, in one call.

:func:`rank` is :func:`~tokenkeys.router.policy.scorer.score_workers`, then
:func:`~tokenkeys.router.policy.cost.cost_workers`, then :func:`~tokenkeys.router.policy.cost.
choose`, then each score with its cost (the decision's ranking). Where the optional C extension
``tokenkeys.router.policy._rank`` is built (``setup.py``) and the cost model is deterministic
(temperature 0), those loops run there in one call with no Python object per candidate but the
ranking's own :class:`~tokenkeys.router.policy.scorer.WorkerScore`: the same floating-point
operations in the same order (compiled without fused multiply-adds), the same rounding of costs
to 9 decimals (CPython's correctly rounded decimal conversion, which ``round`` uses), the same
rendezvous hash (XXH64 from the xxhash package's own library, as the key core finds it). Every
score, cost and order is bit-identical to the Python path's; the tests run the policy's suites
through both and compare the two on random candidates, loads, growth and weights. Anything
outside that domain (a sampled choice, an int where the load view gives floats, a bad weight
or load that the Python path refuses with its error) runs the Python path. Without the
extension, or with ``TOKENKEYS_NATIVE=0``, the Python path runs always.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from types import ModuleType

from tokenkeys.keys.native import ENV, load_core
from tokenkeys.router.index.model import PrefixMatch, Segment
from tokenkeys.router.policy.cost import Candidate, CostWeights, choose, cost_workers
from tokenkeys.router.policy.scorer import WorkerScore, score_workers

#: What the ranking needs of one candidate: ``(worker, load, segments, active_blocks,
#: inflight_prefix, growth, queued_prefill, capacity)``; ``segments`` are its
#: :class:`~tokenkeys.router.index.model.PrefixMatch`'s (None: nothing cached there), the rest
#: :class:`~tokenkeys.router.policy.cost.Candidate`'s fields.
Row = tuple[str, float, "tuple[Segment, ...] | None", float, int, float, float, int]


#: The extension module, or ``None`` (not built, or switched off). Tests replace it to run the
#: Python path in the same process.
CORE: ModuleType | None = load_core("tokenkeys.router.policy._rank")


def rank(
    rows: Sequence[Row],
    total_blocks: int,
    tiers: Mapping[str, float],
    weights: CostWeights,
    *,
    affinity: int | None = None,
    slack: float = 0.0,
    rng: random.Random | None = None,
) -> tuple[list[WorkerScore], float]:
    """The candidates ``rows`` (non-empty) best first, each score with its cost, and the first
    one's blocks to prefill; ``tiers`` are the scorer's tier weights, ``affinity`` and
    ``slack`` :func:`~tokenkeys.router.policy.cost.choose`'s, ``rng`` its draw when
    ``weights.temperature`` is above 0."""
    core = CORE
    if core is not None and weights.temperature <= 0 and type(rows) is list:
        done = core.rank(
            rows,
            total_blocks,
            tiers,
            (weights.prefix, weights.load, weights.overflow, weights.growth),
            affinity,
            slack,
            WorkerScore,
        )
        if done is not None:
            return done
    return rank_python(rows, total_blocks, tiers, weights, affinity=affinity, slack=slack, rng=rng)


def rank_python(
    rows: Sequence[Row],
    total_blocks: int,
    tiers: Mapping[str, float],
    weights: CostWeights,
    *,
    affinity: int | None = None,
    slack: float = 0.0,
    rng: random.Random | None = None,
) -> tuple[list[WorkerScore], float]:
    """:func:`rank` on the Python path: the scorer, the cost model and the choice as written."""
    matches = {r[0]: PrefixMatch(r[0], r[2]) for r in rows if r[2] is not None}
    scores = score_workers(matches, total_blocks, {r[0]: r[1] for r in rows}, weights=tiers)
    loads = {r[0]: Candidate(r[3], r[4], r[5], r[6], r[7]) for r in rows}
    costs = choose(
        cost_workers(scores, total_blocks, loads, weights),
        weights.temperature,
        affinity=affinity,
        slack=slack,
        rng=rng,
    )
    # Each score with its cost, as dataclasses.replace(c.score, cost=c.cost) makes it
    # (without replace's walk over the fields on every call).
    ranking = [
        WorkerScore(s.worker, s.score, s.matched_blocks, s.load, c.cost)
        for c in costs
        for s in (c.score,)
    ]
    return ranking, costs[0].prefill_blocks


def describe() -> str:
    """One line for logs and benchmarks: where the precise policy ranks its candidates."""
    core = CORE
    if core is None:
        return "pure Python" + (f" ({ENV}=0)" if os.environ.get(ENV) == "0" else "")
    return "C" + ("" if core.XXHASH else " (XXH64 not found: prompts with keys in Python)")
