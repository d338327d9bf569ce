"""The compiled ranking (``router.policy._rank``) against the Python path, bit for bit.

``ranking.rank`` runs the precise policy's scores, costs and choice in C where built; the
Python path (``rank_python``: ``score_workers``, ``cost_workers``, ``choose``) is what every
other platform runs. On random candidates (index runs over tiers, loads, load views, growth,
capacities), tier weights, cost weights, affinities and slacks, both give the same ranking: the
same order, and every score and cost with the same bits. Values are drawn from small grids as
well as at random so that equal and nearly equal costs (closer than the 9 decimals costs are
compared at) happen often, and the tie-breaks (rendezvous hash, worker id) and the rounding
decide.
"""

from __future__ import annotations

import math
import struct

import pytest
from evidence import unavailable
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.errors import InvalidArgument
from tokenkeys.router.policy import ranking
from tokenkeys.router.policy.cost import CostWeights, replica_slack
from tokenkeys.router.policy.ranking import rank, rank_python
from tokenkeys.router.policy.scorer import WorkerScore

WORKER_IDS = ("w0", "w1", "w2", "10.0.0.7:8000@m", "10.0.0.17:8000@m", "nœud-é", "z" * 300)
TIERS = ("gpu", "cpu", "disk")
# Near-ties: apart by less than, about, and more than the 1e-9 costs are compared at.
NEAR = (0.0, 1.0, 1.0 + 1e-12, 1.0 + 4e-10, 1.0 + 6e-10, 1.0 + 2e-9, 0.1 + 0.2, 1 / 3, 2.5)


def _core():  # noqa: ANN202
    if ranking.CORE is None:
        unavailable(
            "the compiled ranking tokenkeys.router.policy._rank is not built here "
            f"({ranking.describe()}): `python3 setup.py build_ext --inplace` builds it"
        )
    return ranking.CORE


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def fingerprint(done: tuple[list[WorkerScore], float]) -> list[tuple]:
    """Everything a ranking says, floats by their bits (so -0.0 and 0.0 differ)."""
    scores, prefill = done
    return [
        (
            s.worker,
            bits(s.score),
            type(s.matched_blocks),
            s.matched_blocks,
            bits(s.load),
            bits(s.cost),
        )
        for s in scores
    ] + [bits(prefill)]


floats = st.one_of(st.sampled_from(NEAR), st.floats(0, 1e4, allow_nan=False, allow_infinity=False))
small_ints = st.integers(0, 80)


@st.composite
def segments(draw, total: int):  # noqa: ANN001, ANN201
    """A run of at most ``total`` blocks over tier sets, or None (nothing cached there)."""
    if total == 0 or draw(st.booleans()):
        return None
    out, left = [], draw(st.integers(1, total))
    while left:
        count = draw(st.integers(1, left))
        tiers = tuple(sorted(draw(st.sets(st.sampled_from(TIERS), min_size=1, max_size=3))))
        out.append((count, tiers))
        left -= count
    return tuple(out)


@st.composite
def cases(draw):  # noqa: ANN001, ANN201
    total = draw(st.integers(0, 40))
    workers = draw(st.lists(st.sampled_from(WORKER_IDS), min_size=1, max_size=6, unique=True))

    def row(w: str) -> tuple:
        return (
            w,
            draw(st.one_of(small_ints, floats)),  # load: an int or a float, as polled
            draw(segments(total)),
            draw(floats),  # active blocks: a float, as the load view gives it
            draw(st.integers(0, total + 3)),  # in-flight prefix
            draw(st.one_of(st.sampled_from((0.0, 12.0 * (63 / 64) ** 5)), floats)),  # growth
            draw(st.one_of(small_ints, floats)),  # queued prefill
            draw(st.sampled_from((0, 1, 8, 40, 300))),  # capacity (0: unknown)
        )

    if draw(st.booleans()):
        rows = [row(w) for w in workers]
    else:  # alike but for their blocks in use, nearly equal: the rounding and ties decide
        base = row(workers[0])
        rows = [(w, *base[1:3], draw(st.sampled_from(NEAR)), *base[4:]) for w in workers]
    weight = st.one_of(st.sampled_from((0, 1, 0.0, 0.125, 0.25, 1.0, 0.8)), st.floats(0, 4))
    weights = CostWeights(
        prefix=draw(weight),
        load=draw(weight),
        overflow=draw(weight),
        growth=draw(weight),
        replica_slack=draw(weight),
    )
    tier_weight = st.one_of(st.sampled_from((0, 1, 0.8, 0.5)), st.floats(0, 1))
    tiers = draw(st.dictionaries(st.sampled_from(TIERS), tier_weight, max_size=3))
    affinity = draw(st.one_of(st.none(), st.integers(0, 2**64 - 1)))
    slack = draw(
        st.sampled_from((0, 0.0, replica_slack(total, weights), 1e-10, 3.0)) | st.floats(0, 50)
    )
    return rows, total, tiers, weights, affinity, slack


@settings(max_examples=300, deadline=None)
@given(cases())
def test_the_compiled_ranking_is_the_python_path_bit_for_bit(case):
    core = _core()
    rows, total, tiers, weights, affinity, slack = case
    want = rank_python(rows, total, tiers, weights, affinity=affinity, slack=slack)
    got = core.rank(
        rows,
        total,
        tiers,
        (weights.prefix, weights.load, weights.overflow, weights.growth),
        affinity,
        slack,
        WorkerScore,
    )
    if affinity is not None and not core.XXHASH:
        assert got is None  # no XXH64 in C: the Python path ranks prompts with keys
        return
    assert got is not None, "an input of the compiled path's domain was left to Python"
    assert fingerprint(got) == fingerprint(want)
    assert got[0] == want[0]  # and as dataclasses: the decision's ranking itself
    assert fingerprint(rank(rows, total, tiers, weights, affinity=affinity, slack=slack)) == (
        fingerprint(want)
    )


ROW = ("w0", 1.0, ((3, ("gpu",)),), 2.0, 0, 0.5, 1, 0)


@pytest.mark.parametrize(
    ("row", "total", "tiers", "why"),
    [
        (("w0", True, *ROW[2:]), 4, {"gpu": 1.0}, "a bool load"),
        (("w0", math.nan, *ROW[2:]), 4, {"gpu": 1.0}, "a NaN load"),
        (("w0", -1.0, *ROW[2:]), 4, {"gpu": 1.0}, "a negative load"),
        (ROW, 4, {"gpu": 1.5}, "a tier weight above 1"),
        (ROW, 4, {"gpu": True}, "a bool tier weight"),
        (ROW, 2, {"gpu": 1.0}, "a run longer than the prompt"),
        (ROW, -1, {"gpu": 1.0}, "a negative block count"),
        ((*ROW[:3], 2, *ROW[4:]), 4, {"gpu": 1.0}, "an int where the load view gives a float"),
        ((*ROW[:3], math.inf, *ROW[4:]), 4, {"gpu": 1.0}, "infinite blocks in use"),
        ((*ROW[:2], ((3, ()),), *ROW[3:]), 4, {"gpu": 1.0}, "a segment without tiers"),
    ],
)
def test_inputs_outside_the_compiled_domain_are_left_to_the_python_path(row, total, tiers, why):
    core = _core()
    weights = CostWeights()
    args = ([row], total, tiers, (1.0, 0.125, 1.0, 0.25), 7, 0.0, WorkerScore)
    assert core.rank(*args) is None, why
    # ... which computes the same as before, or refuses it with the scorer's error.
    try:
        want = fingerprint(rank_python([row], total, tiers, weights, affinity=7))
    except (InvalidArgument, ValueError) as exc:
        with pytest.raises(type(exc)):
            rank([row], total, tiers, weights, affinity=7)
    else:
        assert fingerprint(rank([row], total, tiers, weights, affinity=7)) == want


def test_a_sampled_choice_runs_the_python_path_with_its_random_source():
    import random

    rows = [(f"w{i}", 0.0, None, float(i), 0, 0.0, 0, 0) for i in range(4)]
    weights = CostWeights(temperature=1.0)
    picks = {
        rank(rows, 4, {}, weights, affinity=7, rng=random.Random(seed))[0][0].worker
        for seed in range(40)
    }
    assert len(picks) > 1  # drawn, not the cheapest every time
    again = [rank(rows, 4, {}, weights, affinity=7, rng=random.Random(s)) for s in (1, 1)]
    assert fingerprint(again[0]) == fingerprint(again[1])


def test_a_score_type_without_an_instance_dict_is_left_to_the_python_path():
    from dataclasses import dataclass

    @dataclass(frozen=True, slots=True)
    class Slotted:
        worker: str
        score: float
        matched_blocks: int
        load: float
        cost: float | None = None

    args = ([ROW], 4, {"gpu": 1.0}, (1.0, 0.125, 1.0, 0.25), 7, 0.0)
    assert _core().rank(*args, Slotted) is None
    assert _core().rank(*args, WorkerScore) is not None
