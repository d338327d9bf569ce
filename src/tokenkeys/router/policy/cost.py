"""The precise policy's cost model: prefix hits weighed against load, in KV blocks.

Each candidate worker gets a cost (lower is better), every term counted in KV blocks::

    cost = prefix_weight * prefill_blocks
         + load_weight * (active_blocks + queued_prefill)
         + overflow_weight * overflow_blocks
         + growth_weight * growth

- ``prefill_blocks``: the prompt's full blocks the worker would compute, i.e. those not cached
  there (tier-weighted, from the prefix index) and not already referenced there by a request
  this router has in flight (its events may not have arrived yet).
- ``active_blocks``: the worker's KV blocks in use if the request went there: the blocks of
  other clients' requests as last reported in ``GetLoad.used_kv_blocks`` (blocks referenced by
  running requests, not cached but free ones), fading as that report ages, plus the blocks of
  this router's own in-flight requests now (``router.workers.load_view``), plus the request's
  blocks not already in use there.
- ``queued_prefill``: blocks this router's requests there still have to prefill (sent, no
  output yet), other than the prompt's own.
- ``overflow_blocks``: how far ``active_blocks`` exceeds the worker's KV capacity: blocks the
  engine does not have, so the request waits until running ones free them, or the engine
  preempts one of them and recomputes it later.
- ``growth``: new blocks this router recently put into the worker's cache (a sum decayed by
  ``1 - 1/GROWTH_HORIZON`` per routing decision of the pool, so it counts decisions, not
  seconds). It spreads new prefixes when loads read equal, e.g. when requests arrive one at a
  time: a worker that holds only a short common header saves a few blocks of prefill, which
  the growth it took with the last new prefix outweighs.

The first two terms are Dynamo's KV router cost (ai-dynamo/dynamo ``lib/kv-router/src/
scheduling/selector.rs`` @01690d42, ``DefaultWorkerSelector``: ``prefill_load_scale *
(active prefill tokens + the request's uncached tokens) / block_size + decode_blocks``, decode
blocks being the worker's active blocks plus the request's new ones), priced apart. Dynamo
prices the load like the request's own prefill; here it costs ``load_weight`` (1/8 by
default), because the two are not the same work: the request's prefill is new compute that
holds up every request running where it goes, while the load there delays only this request
(its decode steps read the blocks in use, its first token waits for the queued prefill). Below
its KV capacity a continuous-batching engine takes one more request into the same steps; what
it cannot absorb is a request that does not fit, so blocks beyond the capacity cost like
prefill (``overflow_weight`` 1). A conversation therefore stays with its cached prefix unless
the load it would share there is worth more than the prefill it saves, and moves when the
worker cannot hold it; docs/router.md gives the arithmetic behind the defaults. The growth
term plays the part of llm-d's ``no-hit-lru-scorer`` (llm-d-inference-scheduler: cold
requests go to the endpoint least recently given one, to spread cache growth), weighted by
blocks rather than cold or not, because a prompt that shares only a header with cached ones
is warm for llm-d and would follow the header. With ``temperature`` 0 the cheapest worker
wins, ties broken by a stable rule (:func:`choose`); above 0 a worker is drawn with
probability ``exp(-(cost - min) / ((max - min) * temperature))``, normalized, as Dynamo's
``softmax_sample`` does.

Router replicas deciding at the same instant each decide on their own view: what they share
alike is the prefix index (every replica follows every worker's events) and what their peers
told them; what they do not share is their peers' requests of that instant, not heard yet. In
a burst those make the replicas' views of the load differ by about one prompt per worker, and
a load difference that small is each replica's own guess, not knowledge they share. So beside
peers (``Placements.replicated``) the load decides only beyond a slack
(:func:`replica_slack`: ``replica_slack`` times what the prompt would add to a worker as a new
prompt, its blocks in use and queued to prefill at the load weight, its growth at the growth
weight): among the workers at most that much dearer than the cheapest, the prompt goes to the
one with the most of it cached (the fewest blocks to prefill, from the index), then to the
highest rendezvous hash of (its first block key, worker), both of which every replica
computes alike. A follow-up then stays with the worker that holds its conversation although
a peer's view would rate another a little cheaper (without it, replicas moved conversations
between two copies of their system prompt on load differences within one prompt), and two
replicas deciding one new system prompt at the same instant agree whenever its rendezvous
worker is within the slack in each one's view. The slack bounds what the prefix and the hash
may override: a worker dearer than the cheapest by more than one such prompt (its load, queued
prefill, growth, blocks beyond its capacity) never takes it, so a burst of new prompts decided
in turn still ends within two of even (tests/router/policy/test_policy_cost.py). One router
sees all its own decisions and takes the cheapest (with the slack on new prompts its hit ratio
in bench_routing's concurrent workload fell from 81.1 % to 80.5-80.7 %, docs/benchmarks.md).
Replicas that reconcile (``router.replicas.reconcile``: a later copy of a new prompt moves to
the earlier's worker before its first output) give a prompt new everywhere no slack either: it
goes to the cheapest, balanced as one router's, and a split is undone after the decision
(``router.policy.precise``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import xxhash

from tokenkeys.errors import ConfigError
from tokenkeys.router.policy.scorer import WorkerScore

#: Routing decisions over which the growth of a worker decays to 1/e.
GROWTH_HORIZON = 64
# Costs are compared at this many decimals, so float rounding never reorders equal costs.
_DIGITS = 9
# The command-line options of the fields not named ``--<field>-weight``.
_OPTIONS = {"temperature": "router-temperature", "replica_slack": "replica-slack"}


@dataclass(frozen=True)
class CostWeights:
    """The precise policy's weights (``tokenkeys route --prefix-weight ...``).

    - ``prefix``: cost of one block of prefill. Higher keeps prompts with their cached prefix
      (better time to first token, less recomputation) at the price of piling work on the
      worker that holds it; 0 ignores the cache (pure load balancing).
    - ``load``: cost of one block of load there: a KV block in use, or a block of prefill
      queued. Higher spreads running work (decode speed, shorter prefill queues) at the price
      of more prefill; 1 is Dynamo's (load costs like the request's own prefill); 0 ignores
      the load below the capacity.
    - ``overflow``: cost of one block the request needs beyond the worker's KV capacity.
      Higher moves requests off full workers sooner; 0 lets a full worker keep attracting
      the prompts it has cached.
    - ``growth``: cost of one block of new cache this router recently placed on the worker.
      Higher spreads new prefixes over the workers' caches even when loads read equal, at the
      price of short shared prefixes (a common header) being computed more than once.
    - ``temperature``: 0 is deterministic; above 0 workers are sampled, cheaper ones more
      often, which spreads ties and near-ties over replicas at the price of some hits.
    - ``replica_slack``: beside router replicas, how many prompts' worth of cost (what the
      prompt adds to a worker as a new one) a worker may be above the cheapest and still take
      it for holding more of it cached or, for a prompt new everywhere, by rendezvous (module
      doc). Higher makes replicas agree on more prompts at the price of balance; 0 always
      takes the cheapest.
    """

    prefix: float = 1.0
    load: float = 0.125
    growth: float = 0.25
    temperature: float = 0.0
    overflow: float = 1.0
    replica_slack: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prefix", "load", "overflow", "growth", "temperature", "replica_slack"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                option = _OPTIONS.get(name, f"{name}-weight")
                raise ConfigError(
                    f"--{option} must be a finite number >= 0, got {value!r}", field=option
                )


@dataclass(frozen=True)
class Candidate:
    """What the cost needs of one candidate besides its prefix match.

    ``active_blocks``: KV blocks in use there now (see the module doc); ``inflight_prefix``:
    leading blocks of this prompt already referenced there by this router's in-flight
    requests; ``growth``: the decayed count of new blocks this router put there;
    ``queued_prefill``: blocks this router's requests there still have to prefill, the
    prompt's own excluded; ``capacity``: the worker's KV blocks (0: unknown, never full).
    """

    active_blocks: float = 0.0
    inflight_prefix: int = 0
    growth: float = 0.0
    queued_prefill: float = 0.0
    capacity: int = 0


@dataclass(frozen=True)
class WorkerCost:
    """One candidate's cost and its parts (blocks), with its prefix score."""

    worker: str
    cost: float
    prefill_blocks: float
    active_blocks: float
    growth: float
    score: WorkerScore
    queued_prefill: float = 0.0
    overflow_blocks: float = 0.0


def cost_workers(
    scores: Sequence[WorkerScore],
    total_blocks: int,
    loads: Mapping[str, Candidate],
    weights: CostWeights,
) -> list[WorkerCost]:
    """The cost of sending a prompt of ``total_blocks`` full blocks to each scored worker.

    ``scores`` come from :func:`~tokenkeys.router.policy.scorer.score_workers` (``score *
    total_blocks`` is the tier-weighted cached prefix); a worker missing from ``loads`` is
    idle as far as the router knows. The order is that of ``scores``.
    """
    out = []
    for s in scores:
        load = loads.get(s.worker, Candidate())
        inflight = min(load.inflight_prefix, total_blocks)
        cached = max(s.score * total_blocks, float(inflight))
        prefill = max(total_blocks - cached, 0.0)
        # The blocks in use once the request runs there: the ones it shares with requests in
        # flight are referenced already, every other block of it (cached or not) becomes used.
        active = load.active_blocks + (total_blocks - inflight)
        # Blocks beyond the capacity: the engine cannot admit the request until running ones
        # free that many, or it preempts one of them and recomputes it later.
        overflow = max(active - load.capacity, 0.0) if load.capacity > 0 else 0.0
        cost = (
            weights.prefix * prefill
            + weights.load * (active + load.queued_prefill)
            + weights.overflow * overflow
            + weights.growth * load.growth
        )
        out.append(
            WorkerCost(
                worker=s.worker,
                cost=cost,
                prefill_blocks=prefill,
                active_blocks=active,
                growth=load.growth,
                score=s,
                queued_prefill=load.queued_prefill,
                overflow_blocks=overflow,
            )
        )
    return out


def _rendezvous(affinity: int | None, worker: str) -> int:
    if affinity is None:
        return 0
    return xxhash.xxh64_intdigest(affinity.to_bytes(8, "little") + worker.encode())


def _tie(affinity: int | None, c: WorkerCost) -> tuple[int, str]:
    return _rendezvous(affinity, c.worker), c.worker


def replica_slack(total_blocks: int, weights: CostWeights) -> float:
    """How much dearer than the cheapest a worker may be and still take a prompt beside router
    replicas by what they all know alike (:func:`choose`): ``weights.replica_slack`` times what
    the prompt, new, adds to the cost of the worker it goes to: its full blocks and one partial
    block in use and its full blocks queued to prefill at the load weight, its full blocks of
    growth at the growth weight (0 for a prompt without full blocks)."""
    if total_blocks <= 0:
        return 0.0
    # A request in flight holds its full blocks and one partial block (LoadView.own_blocks):
    # without that block a worker exactly one such prompt above the cheapest fell outside the
    # slack, and replicas that had each placed one parted on the prompt (docs/benchmarks.md).
    added = weights.load * (2 * total_blocks + 1) + weights.growth * total_blocks
    return weights.replica_slack * added


def within_slack(cost: float, cheapest: float, slack: float) -> bool:
    """Whether ``cost`` is at most ``slack`` above ``cheapest``, compared at the 9 decimals
    costs are ordered by (:func:`choose`)."""
    return round(cost, _DIGITS) <= round(cheapest + slack, _DIGITS)


def choose(
    costs: Sequence[WorkerCost],
    temperature: float = 0.0,
    *,
    affinity: int | None = None,
    slack: float = 0.0,
    rng: random.Random | None = None,
) -> list[WorkerCost]:
    """``costs`` ordered best first: the chosen worker, then the fallbacks by cost.

    Temperature 0: by cost, then (equal costs) by the highest hash of (``affinity``, worker),
    rendezvous hashing on the prompt's first block key, so that router replicas send one new
    prefix to the same worker before its events arrive; then by worker id. With ``slack`` > 0
    (router replicas, :func:`replica_slack`) the first is, among the workers costing at most
    ``slack`` more than the cheapest, the one with the fewest blocks to prefill, then the
    highest hash; the rest follow by cost.
    Above 0 the first worker is sampled (module doc) with ``rng``.
    """
    ordered = sorted(
        costs, key=lambda c: (round(c.cost, _DIGITS), -_rendezvous(affinity, c.worker), c.worker)
    )
    if len(ordered) < 2:
        return ordered
    if temperature <= 0:
        if slack <= 0 or affinity is None:
            return ordered
        near = [c for c in ordered if within_slack(c.cost, ordered[0].cost, slack)]
        # What every replica knows alike decides within the slack: the prefix, then the hash.
        chosen = max(near, key=lambda c: (-round(c.prefill_blocks, _DIGITS), *_tie(affinity, c)))
        return [chosen, *(c for c in ordered if c is not chosen)]
    low, high = ordered[0].cost, ordered[-1].cost
    if high == low:
        weights = [1.0] * len(ordered)
    else:
        scale = (high - low) * temperature
        weights = [math.exp(-(c.cost - low) / scale) for c in ordered]
    pick = (rng or random).choices(range(len(ordered)), weights=weights)[0]
    chosen = ordered[pick]
    return [chosen, *(c for c in ordered if c is not chosen)]


@dataclass
class GrowthLedger:
    """New blocks this router put into each worker's cache, decayed per decision."""

    horizon: int = GROWTH_HORIZON
    growth: dict[str, float] = field(default_factory=dict)

    def get(self, worker: str) -> float:
        """The worker's decayed growth (0 when it got nothing)."""
        return self.growth.get(worker, 0.0)

    def record(self, worker: str, new_blocks: float) -> None:
        """One decision: every worker's growth decays, then ``worker``'s grows."""
        keep = 1.0 - 1.0 / self.horizon
        for w in self.growth:
            self.growth[w] *= keep
        self.growth[worker] = self.growth.get(worker, 0.0) + new_blocks

    def forget(self, worker: str) -> None:
        """Drop a worker that left the pool."""
        self.growth.pop(worker, None)
