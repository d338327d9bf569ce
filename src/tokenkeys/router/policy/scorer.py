"""Scoring workers by their cached prefix: a pure function over a lookup's answer.

A worker's score is the weighted length of its run of consecutive cached blocks from the start
of the prompt, divided by the prompt's number of full blocks, so it lies in [0, 1]. Each block
counts with the weight of the best tier that holds it (GPU 1.0, CPU 0.8 by default). This is
llm-d's ``LongestPrefixScorer`` (llm-d-router ``pkg/kvcache/kvblock_scorer.go``: max weight
over a pod's entries per key, only pods present at the first key score) normalized as its
inference scheduler does (``preciseprefixcache/utils.go``: score / floor(tokens / block size)).
Equal scores go to the less loaded worker, then by worker id, so the order is total.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tokenkeys.errors import InvalidArgument
from tokenkeys.router.index.model import PrefixMatch

#: Tier weights of llm-d's default ``kvCacheBackendConfigs``.
DEFAULT_TIER_WEIGHTS: Mapping[str, float] = MappingProxyType({"gpu": 1.0, "cpu": 0.8})
#: Weight of a tier missing from the table; llm-d's scorer also counts an unknown tier as 1.0.
UNKNOWN_TIER_WEIGHT = 1.0
# Scores are compared at this many decimals, so float rounding never overrides the load.
_DIGITS = 12


@dataclass(frozen=True)
class WorkerScore:
    """One candidate's score: ``score`` in [0, 1], ``matched_blocks`` consecutive from block 0.

    ``cost`` is set by the precise policy's cost model (``router.policy.cost``; lower is better).
    """

    worker: str
    score: float
    matched_blocks: int
    load: float
    cost: float | None = None


def _check_weight(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InvalidArgument(
            f"tier weight {name} must be a number in [0, 1], got {value!r}", field="weights"
        )
    return float(value)


def score_workers(
    matches: Mapping[str, PrefixMatch],
    total_blocks: int,
    load: Mapping[str, float],
    *,
    weights: Mapping[str, float] = DEFAULT_TIER_WEIGHTS,
    unknown_tier_weight: float = UNKNOWN_TIER_WEIGHT,
) -> list[WorkerScore]:
    """Score every candidate worker, best first.

    ``matches`` is :meth:`PrefixIndex.lookup`'s answer for the prompt's block keys (``{}``
    when the index is unavailable: the order is then by load alone). ``total_blocks`` is the
    prompt's number of full blocks. ``load`` names the candidates and their load (running
    requests, queue length: lower is better); matches of workers not in it are ignored.
    """
    if type(total_blocks) is not int or total_blocks < 0:
        raise InvalidArgument(
            f"total_blocks must be a non-negative integer, got {total_blocks!r}",
            field="total_blocks",
        )
    table = {tier: _check_weight(tier, w) for tier, w in weights.items()}
    default = _check_weight("for unknown tiers", unknown_tier_weight)
    _check_loads(load)
    # Rows (-score, load, worker, score, blocks) sort in C as the order says (worker ids are
    # distinct, so no comparison reaches past them); unmatched workers score exactly 0.
    rows = [(-0.0, float(w_load), w, 0.0, 0) for w, w_load in load.items() if w not in matches]
    for worker in filter(matches.__contains__, load):
        match = matches[worker]
        blocks, weighted = 0, 0.0
        for count, tiers in match.segments:
            blocks += count
            weighted += count * max(table.get(t, default) for t in tiers)
        if blocks > total_blocks:
            raise InvalidArgument(
                f"worker {worker!r} matched {blocks} blocks but the prompt has only "
                f"{total_blocks}; pass the number of full blocks of the looked-up keys",
                field="total_blocks",
            )
        score = weighted / total_blocks if total_blocks else 0.0
        rows.append((-round(score, _DIGITS), float(load[worker]), worker, score, blocks))
    rows.sort()
    # One WorkerScore per candidate (a fleet's 1,000 and more per call): filled as the frozen
    # dataclass's own __init__ fills it (every field into the instance dict, no __post_init__),
    # without its five object.__setattr__ calls, which took most of a 1,000-candidate call.
    out, new = [], object.__new__
    for _, w_load, w, score, blocks in rows:
        item = new(WorkerScore)
        item.__dict__.update(worker=w, score=score, matched_blocks=blocks, load=w_load, cost=None)
        out.append(item)
    return out


_NUMBERS = frozenset({int, float})


def _check_loads(load: Mapping[str, float]) -> None:
    """Every load is a finite number >= 0: one pass in C when all are, else the first bad one."""
    values = load.values()
    try:
        fine = (
            _NUMBERS.issuperset(map(type, values))
            and min(values, default=0) >= 0
            and math.isfinite(sum(values))  # NaN or inf anywhere make the sum so
        )
    except OverflowError:  # an int beyond floats: the loop below says which
        fine = False
    if fine:
        return
    for worker, worker_load in load.items():
        if (
            isinstance(worker_load, bool)
            or not isinstance(worker_load, (int, float))
            or not math.isfinite(worker_load)
            or worker_load < 0
        ):
            raise InvalidArgument(
                f"load of worker {worker!r} must be a finite number >= 0, got {worker_load!r}",
                field="load",
            )
