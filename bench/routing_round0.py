"""Round 0 of bench_routing's concurrent workload, modelled: what replicas can agree on alone.

``PYTHONPATH=src python3 bench/routing_round0.py [--draws N]``. Round 0 opens 16 new system
prompts, each by two conversations at the same instant; a load balancer hands each of the 32
first turns to a random replica, in random order, and every replica decides on its own view,
which holds its own decisions of the instant and nothing of its peers' (in the in-process bench
a round's decisions are all made before any stream entry is read). The model runs the policy's
own code on those views (``LoadView.begin`` for each request sent, ``GrowthLedger.record`` for
each decision, ``cost_workers`` and ``choose`` with the slack of ``replica_slack``) over 4
workers with new addresses per draw (the rendezvous order changes, as with the bench's new ports
every run), prompts of 12-13 shared blocks plus 1-2 of their own (the bench's sizes), and
reports per slack (``--replica-slack``) and replica count, as means over the draws:

- ``split``: prompts placed on two workers (each computed twice: about 200 tokens, 0.5 % of
  one router's cached tokens in the bench);
- ``max convs``: the most conversations one worker got (one router: 8 on each), and how
  often it reached 10, where the bench's 192-block engines overflow at turns 3-4 when all of
  a worker's conversations run at once (10 conversations of 25 blocks, 12-block prompts
  shared in pairs: about 190 blocks plus a partial block each), and their cached histories
  are evicted.

It is not the bench (nothing here runs a turn after round 0), but it shows the trade the
slack makes, in seconds rather than hours of bench runs.
"""

from __future__ import annotations

import random
import statistics
import sys
from collections import Counter
from dataclasses import dataclass

from tokenkeys.router.policy.cost import (
    Candidate,
    CostWeights,
    GrowthLedger,
    choose,
    cost_workers,
    replica_slack,
)
from tokenkeys.router.policy.scorer import WorkerScore
from tokenkeys.router.workers.load_view import LoadView

WORKERS = 4
SYSTEMS = 16
CAPACITY = 192  # KV blocks per engine in the concurrent workload
OVERFLOWING = 10  # conversations on one worker from which its turns 3-4 overflow


@dataclass(frozen=True)
class Round:
    """One draw of round 0: prompts placed on two workers, and conversations per worker."""

    split: int
    max_convs: int


def play(draw: int, replicas: int, weights: CostWeights) -> Round:
    """Round 0 with ``replicas`` routers (1: one router, no slack), the draws of ``draw``."""
    rng = random.Random(draw)
    workers = [f"127.0.0.1:{rng.randrange(30000, 60000)}" for _ in range(WORKERS)]
    shared = [[rng.getrandbits(64) for _ in range(12 + p % 2)] for p in range(SYSTEMS)]
    prompts = [
        shared[c % SYSTEMS] + [rng.getrandbits(64) for _ in range(rng.choice((1, 2)))]
        for c in range(2 * SYSTEMS)
    ]
    views = [
        {w: LoadView(clock=lambda: 0.0, wall=lambda: 0.0) for w in workers} for _ in range(replicas)
    ]
    growth = [GrowthLedger() for _ in range(replicas)]
    order = list(range(2 * SYSTEMS))
    rng.shuffle(order)
    placed: dict[int, str] = {}
    for c in order:
        r = rng.randrange(replicas)
        keys = prompts[c]
        mine = frozenset(keys)
        loads = {
            w: Candidate(
                active_blocks=v.active_blocks,
                inflight_prefix=v.inflight_prefix(keys),
                growth=growth[r].get(w),
                queued_prefill=v.queued_prefill(mine),
                capacity=CAPACITY,
            )
            for w, v in views[r].items()
        }
        scores = [WorkerScore(w, 0.0, 0, 0.0) for w in workers]
        costs = cost_workers(scores, len(keys), loads, weights)
        slack = replica_slack(len(keys), weights) if replicas > 1 else 0.0
        best = choose(costs, 0.0, affinity=keys[0], slack=slack)[0]
        views[r][best.worker].begin(keys)
        growth[r].record(best.worker, best.prefill_blocks)
        placed[c] = best.worker
    split = sum(placed[p] != placed[p + SYSTEMS] for p in range(SYSTEMS))
    return Round(split, max(Counter(placed.values()).values()))


def line(replicas: int, slack: float, draws: int) -> str:
    """One row of the table: means over ``draws`` draws."""
    rounds = [play(d, replicas, CostWeights(replica_slack=slack)) for d in range(draws)]
    split = statistics.mean(r.split for r in rounds)
    convs = statistics.mean(r.max_convs for r in rounds)
    full = sum(r.max_convs >= OVERFLOWING for r in rounds) / draws
    return f"| {replicas} | {slack:g} | {split:.2f} | {convs:.2f} | {100 * full:.0f} % |"


def table(draws: int) -> str:
    """The Markdown table: one router, then 2 and 4 replicas at each slack."""
    rows = [
        "| replicas | slack (prompts) | split prompts | max convs | a worker at 10+ |",
        "|---:|---:|---:|---:|---:|",
        line(1, 0, draws),
    ]
    for replicas in (2, 4):
        rows += [line(replicas, s, draws) for s in (0, 0.5, 1, 1.25, 1.5, 2, 3)]
    return "\n".join(rows)


if __name__ == "__main__":
    count = int(sys.argv[sys.argv.index("--draws") + 1]) if "--draws" in sys.argv else 400
    print(table(count))
