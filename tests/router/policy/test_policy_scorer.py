"""The scorer: weighted longest consecutive prefix, normalized, ties broken by load.

Expected behaviour from llm-d's ``LongestPrefixScorer`` (llm-d-router
``pkg/kvcache/kvblock_scorer.go``) and its normalization by full blocks
(``preciseprefixcache/utils.go``), as summarized in ../shared/reference/engines/llm-d.md §3.4.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys.errors import InvalidArgument
from tokenkeys.keys import block_keys, make_spec
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.index.model import PrefixMatch, prompt_keys
from tokenkeys.router.policy.scorer import DEFAULT_TIER_WEIGHTS, WorkerScore, score_workers


def match(worker: str, *segments: tuple[int, tuple[str, ...]]) -> PrefixMatch:
    return PrefixMatch(worker, tuple(segments))


def test_score_is_weighted_run_over_full_blocks_best_first():
    matches = {
        "a": match("a", (4, ("gpu",))),
        "b": match("b", (2, ("gpu",)), (3, ("cpu",))),
        "c": match("c", (5, ("cpu", "gpu"))),  # best tier of each block counts
    }
    got = score_workers(matches, 10, {"a": 0, "b": 0, "c": 0, "d": 0})
    assert [s.worker for s in got] == ["c", "b", "a", "d"]
    assert got[0] == WorkerScore("c", 0.5, 5, 0.0)
    assert got[1].score == pytest.approx((2 + 3 * 0.8) / 10) and got[1].matched_blocks == 5
    assert got[2].score == pytest.approx(0.4)
    assert got[3] == WorkerScore("d", 0.0, 0, 0.0)


def test_equal_scores_go_to_the_less_loaded_worker_then_by_id():
    matches = {w: match(w, (3, ("gpu",))) for w in "abc"}
    got = score_workers(matches, 8, {"a": 5, "b": 1, "c": 1})
    assert [s.worker for s in got] == ["b", "c", "a"]
    # 5 CPU blocks weigh exactly 4 GPU blocks: a tie, so load decides.
    tie = {"x": match("x", (4, ("gpu",))), "y": match("y", (5, ("cpu",)))}
    assert [s.worker for s in score_workers(tie, 5, {"x": 2, "y": 1})] == ["y", "x"]


def test_without_matches_workers_are_ordered_by_load():
    # What a router does while the index is unavailable: route by load.
    got = score_workers({}, 100, {"w1": 3.0, "w2": 0.5, "w3": 1})
    assert [s.worker for s in got] == ["w2", "w3", "w1"]
    assert all(s.score == 0 and s.matched_blocks == 0 for s in got)


def test_only_candidates_in_the_load_map_are_scored():
    matches = {"gone": match("gone", (9, ("gpu",))), "here": match("here", (1, ("gpu",)))}
    assert [s.worker for s in score_workers(matches, 9, {"here": 0})] == ["here"]
    assert score_workers(matches, 9, {}) == []


def test_configurable_weights_and_unknown_tiers():
    matches = {"s": match("s", (2, ("storage",))), "c": match("c", (2, ("cpu",)))}
    load = {"s": 0, "c": 0}
    # llm-d counts an unknown tier as 1.0; both are configurable.
    assert score_workers(matches, 2, load)[0].worker == "s"
    got = score_workers(matches, 2, load, weights={"cpu": 0.9}, unknown_tier_weight=0.5)
    assert [(s.worker, s.score) for s in got] == [("c", 0.9), ("s", 0.5)]
    assert DEFAULT_TIER_WEIGHTS == {"gpu": 1.0, "cpu": 0.8}


def test_empty_prompt_scores_zero():
    assert score_workers({}, 0, {"a": 1})[0].score == 0.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"total_blocks": -1}, "total_blocks"),
        ({"total_blocks": 2.0}, "total_blocks"),
        ({"total_blocks": 1}, "total_blocks"),  # "a" matched 2 of 1 blocks
        ({"load": {"a": -1}}, "load"),
        ({"load": {"a": float("nan")}}, "load"),
        ({"load": {"a": True}}, "load"),
        # A bad load among good ones (the all-good check runs in one pass; then the loop):
        ({"load": {"a": 0, "b": 2.5, "c": float("inf")}}, "load"),
        ({"load": {"a": 0, "b": float("nan"), "c": -1}}, "load"),
        ({"load": {"a": 3, "b": -0.5}}, "load"),
        ({"weights": {"gpu": 1.5}}, "weights"),
        ({"unknown_tier_weight": -0.1}, "weights"),
    ],
)
def test_inconsistent_inputs_are_refused(kwargs, field):
    args = {"matches": {"a": match("a", (2, ("gpu",)))}, "total_blocks": 4, "load": {"a": 0}}
    with pytest.raises(InvalidArgument) as info:
        score_workers(**{**args, **kwargs})
    assert info.value.field == field


def test_loads_the_one_pass_check_does_not_know_are_still_accepted():
    class Load(float):  # a numpy float64 is a float subclass too
        pass

    huge = 1e308  # finite loads whose sum is not
    got = score_workers({}, 4, {"a": Load(2.0), "b": 1, "c": huge, "d": huge})
    assert [(s.worker, s.load) for s in got] == [("b", 1.0), ("a", 2.0), ("c", huge), ("d", huge)]


async def test_scores_a_prompt_from_real_block_keys():
    spec = make_spec("vllm/sha256_cbor@0.31", 16, root_seed="42")
    conversation = list(range(1000, 1100))  # 6 full blocks, a partial tail
    keys = prompt_keys(block_keys(conversation, spec))
    assert len(keys) == 6
    index = MemoryPrefixIndex()
    await index.add("holds-turn-1", keys[:4])
    await index.add("holds-all", keys, "cpu")
    got = score_workers(await index.lookup(keys), len(keys), {"holds-turn-1": 0, "holds-all": 0})
    assert [(s.worker, s.matched_blocks) for s in got] == [("holds-all", 6), ("holds-turn-1", 4)]
    assert got[0].score == pytest.approx(0.8)


# ----------------------------------------------------------------------------- properties

TIER_SETS = st.sampled_from([("gpu",), ("cpu",), ("cpu", "gpu"), ("storage",)])
RUNS = st.lists(st.tuples(st.integers(1, 5), TIER_SETS), max_size=4).map(lambda segs: tuple(segs))
WORLDS = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.tuples(RUNS, st.integers(0, 4)),
    min_size=1,
)


def _world(world):
    matches = {w: match(w, *segs) for w, (segs, _) in world.items() if segs}
    load = {w: lo for w, (_, lo) in world.items()}
    total = max([m.blocks for m in matches.values()], default=0) + 3
    return matches, load, total


@given(WORLDS)
def test_scores_match_a_block_by_block_recount_and_are_sorted(world):
    matches, load, total = _world(world)
    got = score_workers(matches, total, load)
    assert sorted(s.worker for s in got) == sorted(load)
    for s in got:
        blocks = (
            [tiers for count, tiers in matches[s.worker].segments for _ in range(count)]
            if (s.worker in matches)
            else []
        )
        weight = sum(max(DEFAULT_TIER_WEIGHTS.get(t, 1.0) for t in tiers) for tiers in blocks)
        assert s.matched_blocks == len(blocks)
        assert s.score == pytest.approx(weight / total)
        assert 0.0 <= s.score <= 1.0
    keys = [(-round(s.score, 12), s.load, s.worker) for s in got]
    assert keys == sorted(keys)


@given(WORLDS, st.sampled_from(["a", "b", "c", "d", "e"]))
def test_one_more_cached_block_never_lowers_a_workers_score_or_rank(world, worker):
    matches, load, total = _world(world)
    load.setdefault(worker, 0)
    before = score_workers(matches, total, load)
    segs = matches[worker].segments if worker in matches else ()
    longer = dict(matches, **{worker: PrefixMatch(worker, (*segs, (1, ("gpu",))))})
    after = score_workers(longer, total, load)
    rank = {s.worker: i for i, s in enumerate(before)}
    new_rank = {s.worker: i for i, s in enumerate(after)}
    old_score = next(s.score for s in before if s.worker == worker)
    assert next(s.score for s in after if s.worker == worker) > old_score
    assert new_rank[worker] <= rank[worker]


@given(WORLDS, st.sampled_from(["a", "b", "c", "d", "e"]))
def test_moving_blocks_to_gpu_never_lowers_a_score(world, worker):
    matches, load, total = _world(world)
    if worker not in matches:
        return
    promoted = PrefixMatch(worker, ((matches[worker].blocks, ("gpu",)),))
    before = {s.worker: s.score for s in score_workers(matches, total, load)}
    after = {s.worker: s.score for s in score_workers({**matches, worker: promoted}, total, load)}
    assert after[worker] >= before[worker]
    assert all(after[w] == before[w] for w in before if w != worker)


@given(WORLDS)
def test_candidate_order_in_the_inputs_does_not_matter(world):
    matches, load, total = _world(world)
    reversed_load = dict(reversed(list(load.items())))
    reversed_matches = dict(reversed(list(matches.items())))
    assert score_workers(matches, total, load) == score_workers(
        reversed_matches, total, reversed_load
    )
