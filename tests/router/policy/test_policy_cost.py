"""The precise policy's cost model (``router.policy.cost``): prefix hits weighed against load.

Pure functions over prefix matches and loads, so every case is exact and deterministic. The
costs follow Dynamo's KV router (``prefill blocks + decode blocks``, ai-dynamo/dynamo
``lib/kv-router/src/scheduling/selector.rs`` @01690d42) with the load priced apart from the
request's own prefill, blocks beyond a worker's KV capacity priced like prefill, and a
cache-growth term in the part of llm-d's ``no-hit-lru-scorer``.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys.errors import ConfigError
from tokenkeys.router.index.model import PrefixMatch
from tokenkeys.router.policy.cost import (
    Candidate,
    CostWeights,
    GrowthLedger,
    choose,
    cost_workers,
    replica_slack,
)
from tokenkeys.router.policy.placement import Home
from tokenkeys.router.policy.precise import at_home
from tokenkeys.router.policy.scorer import WorkerScore, score_workers
from tokenkeys.router.workers.load_view import LoadView

WORKERS = ("w0", "w1", "w2", "w3")


def ranked(
    matched: dict[str, int],
    total: int,
    loads: dict[str, Candidate] | None = None,
    weights: CostWeights | None = None,
    affinity: int | None = 7,
    **kw: object,
):  # noqa: ANN201
    """Score (GPU-tier matches of ``matched`` leading blocks), cost and order the workers."""
    matches = {w: PrefixMatch(w, ((n, ("gpu",)),)) for w, n in matched.items() if n}
    scores = score_workers(matches, total, dict.fromkeys(WORKERS, 0.0))
    costs = cost_workers(scores, total, loads or {}, weights or CostWeights())
    return choose(costs, (weights or CostWeights()).temperature, affinity=affinity, **kw)


def test_cost_is_prefill_against_load_overflow_and_growth():
    weights = CostWeights(prefix=2.0, load=0.5, overflow=3.0, growth=0.25)
    loads = {"w1": Candidate(active_blocks=10, growth=8.0, queued_prefill=4, capacity=25)}
    costs = {c.worker: c for c in ranked({"w1": 6}, 20, loads, weights)}
    # w1: 14 blocks to prefill; 10 in use + the request's 20, and 4 queued to prefill; 30 in
    # use of a capacity of 25: 5 blocks short; growth 8.
    w1 = costs["w1"]
    assert (w1.prefill_blocks, w1.active_blocks, w1.queued_prefill) == (14, 30, 4)
    assert w1.overflow_blocks == 5
    assert w1.cost == 2.0 * 14 + 0.5 * (30 + 4) + 3.0 * 5 + 0.25 * 8
    # An idle worker of unknown capacity without the prefix: all 20 blocks to prefill, the
    # request's 20 in use, never short.
    assert costs["w0"].cost == 2.0 * 20 + 0.5 * 20
    assert costs["w0"].overflow_blocks == 0


def test_default_weights():
    """A block of load costs 1/8 of a block of prefill, a block beyond the capacity a whole
    one (docs/router.md, "Routing", has the arithmetic); Dynamo prices both load and prefill
    at 1."""
    d = CostWeights()
    assert (d.prefix, d.load, d.overflow, d.growth, d.temperature) == (1, 0.125, 1, 0.25, 0)


def test_blocks_in_flight_there_count_as_cached_and_as_already_in_use():
    """A request this router sent is still running: its events may not have arrived, but its
    blocks are referenced there; a second prompt with that prefix shares them."""
    loads = {"w2": Candidate(active_blocks=24, inflight_prefix=20)}
    best = ranked({}, 24, loads)[0]
    assert best.worker == "w2"
    assert (best.prefill_blocks, best.active_blocks) == (4, 24 + 4)


def test_new_prefixes_spread_by_load():
    """Prompts that match nowhere go to the worker with the fewest blocks in use."""
    loads = {
        "w0": Candidate(active_blocks=40),
        "w1": Candidate(active_blocks=12),
        "w2": Candidate(active_blocks=30),
        "w3": Candidate(active_blocks=25),
    }
    assert [c.worker for c in ranked({}, 10, loads)] == ["w1", "w3", "w2", "w0"]


def test_a_burst_of_new_prefixes_goes_round_the_workers():
    """Requests arriving together, each counted in flight where it went (as the forwarder
    does) before the next is routed: each worker gets one before any gets a second."""
    active: Counter[str] = Counter()
    growth = GrowthLedger()
    chosen = []
    for i in range(8):
        loads = {w: Candidate(active_blocks=active[w], growth=growth.get(w)) for w in WORKERS}
        best = ranked({}, 12, loads, affinity=1000 + i)[0]
        growth.record(best.worker, best.prefill_blocks)
        active[best.worker] += 12
        chosen.append(best.worker)
    assert Counter(chosen) == Counter(dict.fromkeys(WORKERS, 2))
    assert set(chosen[:4]) == set(WORKERS)


def simulate_header_prompts(weights: CostWeights, prompts: int = 12) -> Counter[str]:
    """Prompts of 20 blocks, one at a time on idle workers, that share their first 2 blocks
    (a common header) and nothing else. Whoever runs one holds the header afterwards."""
    growth = GrowthLedger()
    holders: set[str] = {"w0"}  # w0 served the first such prompt earlier
    served: Counter[str] = Counter()
    for _ in range(prompts):
        loads = {w: Candidate(growth=growth.get(w)) for w in WORKERS}
        best = ranked(dict.fromkeys(holders, 2), 20, loads, weights, affinity=77)[0]
        growth.record(best.worker, best.prefill_blocks)
        holders.add(best.worker)
        served[best.worker] += 1
    return served


def test_a_worker_holding_only_a_short_common_header_does_not_attract_everything():
    served = simulate_header_prompts(CostWeights())
    assert set(served) == set(WORKERS)
    assert max(served.values()) == 3  # 12 prompts over 4 workers
    # Without the growth term (prefix and load only, loads idle), the header decides alone.
    assert simulate_header_prompts(CostWeights(growth=0.0)) == Counter(w0=12)


def test_a_long_cached_prefix_outweighs_recent_growth():
    """A follow-up turn whose 29 of 30 blocks are cached on w3 stays there, although w3 took
    far more new blocks lately than the others."""
    loads = {"w3": Candidate(growth=100.0)}
    assert ranked({"w3": 29}, 30, loads)[0].worker == "w3"


def test_a_conversation_stays_with_its_prefix_while_the_load_there_is_worth_less():
    """A follow-up turn saves 29 blocks of prefill on w3, where 60 more blocks are in use and
    10 more are queued to prefill than elsewhere: at 1/8 a block that load is worth 8.75
    blocks, so it stays. At Dynamo's price (a block of load like a block of prefill) it moves,
    and the 29 blocks are computed a second time."""
    busy = {"w3": Candidate(active_blocks=60, queued_prefill=10, capacity=400)}
    assert ranked({"w3": 29}, 30, busy)[0].worker == "w3"
    assert ranked({"w3": 29}, 30, busy, CostWeights(load=1.0))[0].worker != "w3"
    # It moves once the load there is worth more than the prefill saved: 240 blocks more.
    crowded = {"w3": Candidate(active_blocks=240, capacity=400)}
    assert ranked({"w3": 29}, 30, crowded)[0].worker != "w3"


def test_a_worker_that_cannot_hold_the_request_loses_it():
    """Blocks beyond the capacity cost like prefill: the request would wait for running
    requests to free them (or the engine would preempt one and recompute it)."""
    # 60 + 30 blocks in use of 80: 10 short, fewer than the 29 blocks of prefill saved.
    tight = {"w3": Candidate(active_blocks=60, capacity=80)}
    best = ranked({"w3": 29}, 30, tight)[0]
    assert (best.worker, best.overflow_blocks) == ("w3", 10)
    # Of 50: 40 short, more than the prefill saved.
    full = {"w3": Candidate(active_blocks=60, capacity=50)}
    assert ranked({"w3": 29}, 30, full)[0].worker != "w3"
    # With the overflow weight at 0 a full worker keeps its prompts while the load allows.
    assert ranked({"w3": 29}, 30, full, CostWeights(overflow=0.0))[0].worker == "w3"


def test_prefill_queued_on_a_worker_spreads_new_prompts():
    """New prompts (cached nowhere) avoid the worker whose queue of prefill is longest, even
    while the blocks in use read equal."""
    queued = dict(zip(WORKERS, (40, 0, 8, 8), strict=True))
    loads = {w: Candidate(active_blocks=20, queued_prefill=q) for w, q in queued.items()}
    assert [c.worker for c in ranked({}, 10, loads, affinity=None)] == ["w1", "w2", "w3", "w0"]


def simulate_round(weights: CostWeights, seed: int, small: int = 0) -> tuple[int, Counter[str]]:
    """One round of 32 follow-up turns sent at once over 4 workers of 400 KV blocks (w0 of
    ``small`` when set), each worker holding the cached prefixes of 8 conversations (20 of
    each prompt's 24 blocks). Each request is counted in flight where it went before the next
    is routed (as the forwarder does), in a random order. Returns the turns that left their
    prefix and the requests per worker."""
    rng = random.Random(seed)
    home = {c: WORKERS[c % 4] for c in range(32)}
    order = list(home)
    rng.shuffle(order)
    capacity = {w: 400 for w in WORKERS} | ({"w0": small} if small else {})
    active: Counter[str] = Counter()
    queued: Counter[str] = Counter()
    served: Counter[str] = Counter()
    moved = 0
    for c in order:
        loads = {
            w: Candidate(active_blocks=active[w], queued_prefill=queued[w], capacity=capacity[w])
            for w in WORKERS
        }
        best = ranked({home[c]: 20}, 24, loads, weights, affinity=c)[0]
        moved += best.worker != home[c]
        active[best.worker] += 24 + 1  # the prompt's blocks and a partial one
        queued[best.worker] += best.prefill_blocks
        served[best.worker] += 1
    return moved, served


@pytest.mark.parametrize("seed", range(5))
def test_a_burst_of_follow_ups_keeps_its_affinity_and_spreads_real_overload(seed):
    """The burst arrives in random order, so for a while some workers have many more of it in
    flight than others; that passes, and at the default weights no turn leaves its prefix. At
    Dynamo's price the transient imbalance moves turns. A worker too small for its 8
    conversations sheds the turns it cannot hold."""
    assert simulate_round(CostWeights(), seed) == (0, Counter(dict.fromkeys(WORKERS, 8)))
    assert simulate_round(CostWeights(load=1.0), seed)[0] > 0
    moved, served = simulate_round(CostWeights(), seed, small=150)
    # 150 blocks hold 6 of these requests (25 blocks each): w0 keeps those and sheds some of
    # the rest, the other workers' turns stay.
    assert 6 <= served["w0"] < 8
    assert moved == 8 - served["w0"]


def test_prefix_weight_zero_is_pure_load_balancing():
    loads = {"w0": Candidate(active_blocks=5)}
    weights = CostWeights(prefix=0.0, growth=0.0)
    assert ranked({"w0": 30}, 30, loads, weights)[0].worker != "w0"


def test_equal_costs_are_broken_by_a_stable_rule():
    """Ties go to the highest hash of (the prompt's first block key, worker): the same prompt
    goes to the same worker from every router replica; without a key, to the lowest id."""
    first = [c.worker for c in ranked({}, 8, affinity=12345)]
    again = [c.worker for c in ranked({}, 8, affinity=12345)]
    assert first == again
    others = {ranked({}, 8, affinity=k)[0].worker for k in range(40)}
    assert others == set(WORKERS)  # different prompts spread over the workers
    assert [c.worker for c in ranked({}, 8, affinity=None)] == list(WORKERS)


def test_temperature_samples_cheaper_workers_more_often():
    weights = CostWeights(load=1.0, temperature=0.5)
    loads = {"w1": Candidate(active_blocks=4), "w2": Candidate(active_blocks=8)}
    rng = random.Random(3)
    picks = Counter(ranked({"w0": 10}, 10, loads, weights, rng=rng)[0].worker for _ in range(400))
    # Costs w0 10, w3 20, w1 24, w2 28: probabilities exp(-(c - 10) / (18 * 0.5)), normalized.
    expect = {w: math.exp(-(c - 10) / 9) for w, c in (("w0", 10), ("w3", 20), ("w1", 24))}
    assert picks["w0"] > picks["w3"] > picks["w1"] > picks["w2"] > 0
    share = picks["w0"] / 400
    total = sum(expect.values()) + math.exp(-18 / 9)
    assert abs(share - expect["w0"] / total) < 0.08
    # The same seed draws the same workers.
    again = random.Random(3)
    assert [ranked({"w0": 10}, 10, loads, weights, rng=again)[0].worker for _ in range(20)] == [
        ranked({"w0": 10}, 10, loads, weights, rng=r)[0].worker
        for r in [random.Random(3)]
        for _ in range(20)
    ]
    # Temperature 0 never samples.
    assert {ranked({"w0": 10}, 10, loads, CostWeights(load=1.0))[0].worker for _ in range(20)} == {
        "w0"
    }


@pytest.mark.parametrize(
    ("field", "value", "option"),
    [
        ("prefix", -1.0, "--prefix-weight"),
        ("load", math.nan, "--load-weight"),
        ("growth", math.inf, "--growth-weight"),
        ("overflow", -0.1, "--overflow-weight"),
        ("temperature", True, "--router-temperature"),
        ("load", "1", "--load-weight"),
        ("replica_slack", -0.5, "--replica-slack"),
    ],
)
def test_weights_are_finite_non_negative_numbers(field, value, option):
    with pytest.raises(ConfigError, match=f"{option} must be a finite number >= 0"):
        CostWeights(**{field: value})


def test_growth_decays_per_decision_and_forgets_workers_that_left():
    ledger = GrowthLedger(horizon=4)
    ledger.record("w0", 8.0)
    ledger.record("w1", 4.0)
    assert ledger.get("w0") == 8.0 * 0.75
    assert ledger.get("w1") == 4.0
    ledger.forget("w0")
    assert ledger.get("w0") == 0.0


def new_prompt(loads: dict[str, Candidate], total: int = 12, key: int = 7, **kw: float):  # noqa: ANN201
    """The ranking of a prompt of ``total`` blocks cached and in flight nowhere, as the precise
    policy makes it beside router replicas: the slack of :func:`replica_slack` on its first
    block key ``key``."""
    weights = CostWeights(**kw)
    scores = score_workers({}, total, dict.fromkeys(WORKERS, 0.0))
    costs = cost_workers(scores, total, loads, weights)
    slack = replica_slack(total, weights)
    return choose(costs, weights.temperature, affinity=key, slack=slack)


def rendezvous_order(key: int, workers=WORKERS) -> list[str]:  # noqa: ANN001
    """Workers by the rendezvous hash of (``key``, worker), highest first, as
    xxh64(key as 8 little-endian bytes + worker id) (``router.policy.cost``)."""
    return sorted(
        workers,
        key=lambda w: -xxhash.xxh64_intdigest(key.to_bytes(8, "little") + w.encode()),
    )


def test_the_slack_is_what_the_prompt_adds_as_a_new_one():
    """Default: what the prompt adds to a worker's cost as a new one (its 12 full blocks and
    one partial block in use and its 12 blocks queued to prefill at the load weight, its
    growth at the growth weight: 25 / 8 + 12 / 4 = 6.125 for 12 blocks), whatever is cached
    of it; 0 for a prompt without a full block, or with the slack or both weights at 0."""
    weights = CostWeights()
    assert weights.replica_slack == 1.0
    assert replica_slack(12, weights) == 6.125
    dynamo = CostWeights(load=1.0, replica_slack=0.5)
    assert replica_slack(12, dynamo) == 0.5 * 28
    assert replica_slack(0, weights) == 0.0
    for off in (CostWeights(replica_slack=0.0), CostWeights(load=0.0, growth=0.0)):
        assert replica_slack(12, off) == 0.0


def held_prompt(held: str, loads: dict[str, Candidate], key: int = 7, **kw: float):  # noqa: ANN201
    """The ranking beside replicas of a 20-block follow-up whose first 16 blocks ``held``
    caches and whose first 12 (its system prompt) the other workers cache."""
    weights = CostWeights(**kw)
    matches = {w: PrefixMatch(w, ((16 if w == held else 12, ("cpu",)),)) for w in WORKERS}
    scores = score_workers(matches, 20, dict.fromkeys(WORKERS, 0.0))
    costs = cost_workers(scores, 20, loads, weights)
    return choose(costs, weights.temperature, affinity=key, slack=replica_slack(20, weights))


@pytest.mark.parametrize("key", range(8))
def test_beside_replicas_a_follow_up_stays_with_its_holder_within_the_slack(key):
    """The holder has 40 blocks in use more than the others (5 of cost at 1/8) and saves 4
    blocks of prefill (4 of cost): one router, taking the cheapest, moves the conversation to
    a worker that holds only its system prompt; beside replicas a load difference within
    the slack (10.125 for 20 blocks) does not override the prefix every replica knows alike,
    whatever the prompt's rendezvous order. Beyond the slack the load decides again."""
    busy = {"w2": Candidate(active_blocks=40)}
    assert held_prompt("w2", busy, key, replica_slack=0.0)[0].worker != "w2"
    assert held_prompt("w2", busy, key)[0].worker == "w2"
    full = {"w2": Candidate(active_blocks=120)}  # 15 of cost: beyond the slack
    assert held_prompt("w2", full, key)[0].worker != "w2"


@pytest.mark.parametrize("size", [12, 13, 14])
def test_a_worker_one_prompt_above_the_cheapest_as_a_router_counts_it_is_within_the_slack(size):
    """The slack is what one such prompt adds as the router counts it: a request sent there
    (``LoadView.begin``) holds its full blocks and one partial block, its full blocks queued
    to prefill, and the decision records its growth. A worker exactly one prompt of the same
    size above the others stays a candidate, so its rendezvous prompts still go there (the
    slack once left the partial block out, and replicas that had each placed one prompt
    parted on the next: docs/benchmarks.md)."""
    view = LoadView()
    view.begin(tuple(range(1000, 1000 + size)))
    growth = GrowthLedger()
    growth.record("w0", float(size))
    busy = Candidate(
        active_blocks=view.active_blocks,
        queued_prefill=view.queued_prefill(frozenset()),
        growth=growth.get("w0"),
    )
    for key in range(64):
        if rendezvous_order(key)[0] == "w0":
            assert new_prompt({"w0": busy}, total=size, key=key)[0].worker == "w0"


def test_a_new_prompt_goes_to_its_rendezvous_worker_among_the_workers_within_the_slack():
    """w0 is the cheapest by 2 blocks of load cost (16 blocks in use at 1/8); within the
    slack of a 12-block prompt (6) every worker is a candidate, and the prompt's rendezvous
    worker takes it; the others follow by cost, as fallbacks."""
    for key in range(20):
        loads = {w: Candidate(active_blocks=16) for w in WORKERS if w != "w0"}
        ranking = [c.worker for c in new_prompt(loads, key=key)]
        assert ranking[0] == rendezvous_order(key)[0]
        rest = [c.worker for c in new_prompt(loads, key=key, replica_slack=0.0)]
        assert rest[0] == "w0"  # without the slack the cheapest, as before
        assert ranking[1:] == [w for w in rest if w != ranking[0]]


@given(
    key=st.integers(0, 2**64 - 1),
    mine=st.lists(st.integers(0, 40), min_size=4, max_size=4),
    theirs=st.lists(st.integers(0, 40), min_size=4, max_size=4),
    growth=st.lists(st.floats(0, 40), min_size=4, max_size=4),
)
def test_the_choice_is_deterministic_and_never_dearer_than_the_cheapest_by_more_than_the_slack(
    key, mine, theirs, growth
):
    """Whatever the loads: the same inputs give the same worker; the chosen worker costs at
    most the slack above the cheapest (a real load difference beyond it is respected); it
    is the rendezvous-first worker of those within the slack."""
    loads = {
        w: Candidate(active_blocks=a, queued_prefill=q, growth=g)
        for w, a, q, g in zip(WORKERS, mine, theirs, growth, strict=True)
    }
    ranking = new_prompt(loads, key=key)
    assert [c.worker for c in new_prompt(loads, key=key)] == [c.worker for c in ranking]
    cheapest = min(c.cost for c in ranking)
    slack = 6.125  # 25 blocks x 1/8 + 12 blocks x 1/4
    assert ranking[0].cost <= cheapest + slack + 1e-9
    near = {c.worker for c in ranking if c.cost <= cheapest + slack + 1e-9}
    assert ranking[0].worker == next(w for w in rendezvous_order(key) if w in near)


@given(
    key=st.integers(0, 2**64 - 1),
    base=st.lists(st.integers(0, 60), min_size=4, max_size=4),
    lead=st.integers(0, 24),
    mine=st.lists(st.integers(0, 1), min_size=4, max_size=4),
    theirs=st.lists(st.integers(0, 1), min_size=4, max_size=4),
)
def test_replicas_whose_views_differ_by_less_than_the_slack_agree_on_a_new_prompt(
    key, base, lead, mine, theirs
):
    """Two replicas share the same load (``base``, where the prompt's rendezvous worker has
    ``lead`` blocks in use more than the least loaded other: up to 3 of cost, half the slack
    of a 12-block prompt) and each added requests of its own the other has not heard of yet
    (24 blocks in use on any workers: 3 of cost, the other half). Both send the prompt to its
    rendezvous worker, each on its own view; without the slack they part whenever their own
    requests make different workers the cheapest."""
    first = rendezvous_order(key)[0]
    others = [b for w, b in zip(WORKERS, base, strict=True) if w != first]
    base = [min(others) + lead if w == first else b for w, b in zip(WORKERS, base, strict=True)]

    def view(extra: list[int], **kw: float) -> str:
        loads = {
            w: Candidate(active_blocks=b + 24 * e)
            for w, b, e in zip(WORKERS, base, extra, strict=True)
        }
        return new_prompt(loads, key=key, **kw)[0].worker

    assert view(mine) == view(theirs) == first
    rows = list(zip(WORKERS, base, mine, strict=True))
    cheaper = any(w != first and b == min(others) and not e for w, b, e in rows)
    if lead and cheaper:  # another worker is the cheapest here: the slack made the difference
        assert view(mine, replica_slack=0.0) != first


def test_with_the_slack_at_0_equal_costs_still_go_by_rendezvous():
    """The existing rule: equal costs, the highest hash of (first block key, worker)."""
    for key in range(10):
        ranking = new_prompt({}, key=key, replica_slack=0.0)
        assert ranking[0].worker == rendezvous_order(key)[0]


@pytest.mark.parametrize("seed", range(20))
def test_one_router_spreads_a_burst_of_new_prompts_within_one_prompt_of_even(seed):
    """One router routing 16 new 12-block prompts in turn, each counted where it went before
    the next (blocks in use and queued, growth): a worker takes one by rendezvous only while
    it is at most one prompt above the cheapest, so no two end more than 2 prompts apart
    (by rendezvous alone, an unbounded slack, these seeds leave them up to 8 apart)."""
    rng = random.Random(seed)
    active: Counter[str] = Counter()
    growth = GrowthLedger()
    served: Counter[str] = Counter()
    for _ in range(16):
        loads = {
            w: Candidate(active_blocks=active[w], queued_prefill=active[w], growth=growth.get(w))
            for w in WORKERS
        }
        best = new_prompt(loads, key=rng.getrandbits(64))[0]
        growth.record(best.worker, best.prefill_blocks)
        active[best.worker] += 12
        served[best.worker] += 1
    counts = [served[w] for w in WORKERS]
    assert sum(counts) == 16
    assert max(counts) - min(counts) <= 2


class _Moved:
    """Placements that know one moved prompt: the one ending at block key ``last``, gone to
    ``worker`` from ``left``, which held ``kept`` of its blocks before
    (``router.replicas.reconcile``)."""

    def __init__(self, last: int, worker: str, left: str = "w0", kept: int = 0) -> None:
        self.last, self.home_ = last, Home(worker, left, kept)

    def home(self, model: str, keys, blocks: int) -> Home | None:  # noqa: ANN001
        return self.home_ if 0 < blocks <= len(keys) and keys[blocks - 1] == self.last else None


def _ranked(
    w0_matched: int = 4,
    w1_matched: int = 4,
    w0_cost: float = 10.0,
    w1_cost: float = 10.5,
    w2_cost: float = 11.0,
) -> tuple[list[WorkerScore], float]:
    """w0 first, then w1 and w2 (which holds nothing), as the cost model ranked them."""
    return [
        WorkerScore("w0", 0.8, w0_matched, 0.0, w0_cost),
        WorkerScore("w1", 0.8, w1_matched, 0.0, w1_cost),
        WorkerScore("w2", 0.0, 0, 0.0, w2_cost),
    ], 2.0


def test_a_moved_prompts_next_turn_stays_where_it_went_within_the_slack():
    """Twins: w0 and w1 both hold the 4 blocks of a prompt moved from w0 to w1; the rendezvous
    hash chose w0. The next turn goes to w1, unless w1 holds less of it or costs more than the
    slack above the cheapest; a prompt that was not moved keeps the hash's choice."""
    keys = [7, 8, 9, 10, 11, 12]
    moved = _Moved(10, "w1", left="w2")  # from a worker that lost it since: w0 is no twin
    assert [s.worker for s in at_home(_ranked(), moved, "m", keys, 1.0, 1.0)[0]] == [
        "w1",
        "w0",
        "w2",
    ]
    assert at_home(_ranked(), moved, "m", keys, 1.0, 1.0)[1] == 2.0
    for kept in (
        at_home(_ranked(w1_matched=3), moved, "m", keys, 1.0, 1.0),  # holds less of it
        at_home(_ranked(w1_cost=11.5), moved, "m", keys, 1.0, 1.0),  # beyond the slack
        at_home(_ranked(), _Moved(9, "w1"), "m", keys, 1.0, 1.0),  # another prompt moved
    ):
        assert kept[0][0].worker == "w0"


def test_the_worker_a_prompt_left_is_priced_without_what_its_attempt_left_there():
    """A burst: w0, which the prompt left, reads far cheaper in this replica's view (its
    peers' requests there not heard yet); one router, which never made the moved attempt,
    would find there only what w0 held before it (1 block of 4), three blocks more to
    prefill. So w1, where the prompt went, goes first while it costs at most the slack more
    than w0 priced so (and than w2, which holds nothing). Where w0 held all of it before, or
    w1 holds less, or w2 is cheaper by more than the slack, the cost model's order stands."""
    keys = [7, 8, 9, 10, 11, 12]
    moved = _Moved(10, "w1", left="w0", kept=1)

    def first(home: _Moved, **costs: float) -> str:
        return at_home(_ranked(**costs), home, "m", keys, 1.0, 1.0)[0][0].worker

    burst = {"w1_cost": 13.5, "w2_cost": 15.0}  # w1 3.5 above w0, beyond a slack of 1
    assert first(moved, **burst) == "w1"
    assert first(moved, w1_cost=14.5, w2_cost=15.0) == "w0"  # 1.5 above w0 priced so
    assert first(moved, w1_cost=13.5, w2_cost=12.0) == "w0"  # 1.5 above w2
    # w0's attempt was cut short (it holds 3): the prompt's end is w1's match, found there.
    assert first(moved, w0_matched=3, w1_cost=12.5, w2_cost=15.0) == "w1"
    assert first(_Moved(10, "w1", left="w0", kept=4), **burst) == "w0"  # w0 held it all
    assert first(moved, w1_matched=3, w1_cost=12.0, w2_cost=15.0) == "w0"  # w1 holds less
