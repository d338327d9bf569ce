"""One conformance suite for every prefix-index backend (in memory, Redis on a real server).

Each test runs once per backend with the same expectations, so the backends answer identically;
a model-based property test drives both with random updates and compares every lookup with a
plain reference model. Pattern: llm-d's shared index tests (llm-d-router
``pkg/kvcache/kvblock/index_test.go`` runs one suite over its in-memory and Redis indexes).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkeys.errors import InvalidArgument
from tokenkeys.router.index.model import PrefixIndex, PrefixMatch, index_key, medium_tier

GPU = ("gpu",)
CPU = ("cpu",)
BOTH = ("cpu", "gpu")
TOP = (1 << 64) - 1


def run(worker: str, *segments: tuple[int, tuple[str, ...]]) -> PrefixMatch:
    return PrefixMatch(worker, tuple(segments))


async def test_backends_satisfy_the_protocol(backend):
    assert isinstance(backend.new(), PrefixIndex)


async def test_empty_index_has_no_matches_and_no_workers(backend):
    index = backend.new()
    assert await index.lookup([1, 2, 3]) == {}
    assert await index.lookup([]) == {}
    assert await index.workers() == frozenset()


async def test_lookup_gives_each_workers_consecutive_run_from_the_first_block(backend):
    index = backend.new()
    await index.add("w1", [1, 2, 3])
    await index.add("w2", [1, 2])
    await index.add("w3", [2, 3])  # misses the first block: no run at all
    await index.add("w4", [1, 2, 4])  # block 3 missing: the run stops at 2
    got = await index.lookup([1, 2, 3, 4, 5])
    assert got == {
        "w1": run("w1", (3, GPU)),
        "w2": run("w2", (2, GPU)),
        "w4": run("w4", (2, GPU)),
    }
    assert got["w1"].blocks == 3
    assert await index.workers() == {"w1", "w2", "w3", "w4"}


async def test_tiers_are_run_length_encoded_in_prompt_order(backend):
    index = backend.new()
    await index.add("w", [1, 2, 3], "gpu")
    await index.add("w", [3, 4, 5, 6], "cpu")
    await index.add("w", [6], "gpu")
    got = await index.lookup([1, 2, 3, 4, 5, 6, 7])
    assert got == {"w": run("w", (2, GPU), (1, BOTH), (2, CPU), (1, BOTH))}
    assert got["w"].blocks == 6


async def test_add_is_idempotent(backend):
    index = backend.new()
    for _ in range(3):
        await index.add("w", [7, 8], "cpu")
        await index.add("w", [7, 8], "gpu")
    assert await index.lookup([7, 8]) == {"w": run("w", (2, BOTH))}


async def test_remove_drops_one_tier_and_then_the_block(backend):
    index = backend.new()
    await index.add("w", [1, 2, 3], "gpu")
    await index.add("w", [1, 2, 3], "cpu")
    await index.remove("w", [2], "gpu")
    assert await index.lookup([1, 2, 3]) == {"w": run("w", (1, BOTH), (1, CPU), (1, BOTH))}
    await index.remove("w", [2], "cpu")
    assert await index.lookup([1, 2, 3]) == {"w": run("w", (1, BOTH))}
    await index.remove("w", [1, 3], "cpu")
    await index.remove("w", [1, 3], "gpu")
    assert await index.lookup([1, 2, 3]) == {}
    assert await index.workers() == frozenset()


async def test_remove_of_what_is_not_held_changes_nothing(backend):
    index = backend.new()
    await index.add("w", [1, 2], "gpu")
    await index.remove("w", [3, 4], "gpu")  # unknown keys
    await index.remove("w", [1], "cpu")  # held, but on another tier
    await index.remove("other", [1, 2], "gpu")  # another worker
    await index.remove("w", [], "gpu")
    assert await index.lookup([1, 2]) == {"w": run("w", (2, GPU))}
    assert await index.workers() == {"w"}


async def test_clear_forgets_one_worker_on_every_tier(backend):
    index = backend.new()
    await index.add("w1", [1, 2, 3], "gpu")
    await index.add("w1", [3, 4], "cpu")
    await index.add("w2", [1, 2], "gpu")
    await index.clear("w1")
    assert await index.lookup([1, 2, 3, 4]) == {"w2": run("w2", (2, GPU))}
    assert await index.workers() == {"w2"}
    await index.clear("w1")  # again: nothing left to do
    await index.clear("never-seen")
    await index.add("w1", [1], "gpu")  # a cleared worker starts afresh
    assert (await index.lookup([1, 2]))["w1"] == run("w1", (1, GPU))


async def test_lookup_filter_restricts_the_answer_to_named_workers(backend):
    index = backend.new()
    for w in ("a", "b", "c"):
        await index.add(w, [1, 2])
    assert set(await index.lookup([1, 2], workers=["a", "c", "zz"])) == {"a", "c"}
    assert await index.lookup([1, 2], workers=[]) == {}
    assert await index.lookup([1, 2], workers=frozenset({"b"})) == {"b": run("b", (2, GPU))}


async def test_a_filter_naming_many_workers_gives_the_same_answer(backend):
    index = backend.new()
    await index.add("a", [1, 2])
    await index.add("b", [1])
    names = [f"absent-{i}" for i in range(1500)] + ["a"]  # longer than a Lua unpack allows
    assert await index.lookup([1, 2], workers=names) == {"a": run("a", (2, GPU))}


async def test_full_u64_key_range_and_key_conversion(backend):
    index = backend.new()
    keys = [0, 1 << 63, TOP, index_key(-1), index_key(b"\x01" * 32)]
    await index.add("w", keys)
    assert await index.lookup(keys) == {"w": run("w", (5, GPU))}
    # SGLang's signed int64 event hash and its unsigned reading are one key.
    assert index_key(-1) == TOP and index_key(b"\x12\x34") == 0x1234
    assert index_key(b"\xff" * 24 + (5).to_bytes(8, "big")) == 5


async def test_long_prompts_span_several_update_chunks(backend):
    index = backend.new()
    keys = list(range(10_000, 15_000))  # more than one Redis script chunk (2048)
    await index.add("w", keys, "gpu")
    await index.add("v", keys[:4_000], "cpu")
    got = await index.lookup(keys)
    assert got == {"w": run("w", (5_000, GPU)), "v": run("v", (4_000, CPU))}
    await index.remove("w", keys[2_500:], "gpu")
    assert (await index.lookup(keys))["w"].blocks == 2_500
    await index.clear("v")
    assert set(await index.lookup(keys)) == {"w"}


async def test_worker_ids_may_hold_any_characters(backend):
    index = backend.new()
    names = ["10.0.0.7:8000", "pod/a@b#dp1", "ü|,{x}", "a b"]
    for name in names:
        await index.add(name, [5, 6])
    got = await index.lookup([5, 6])
    assert set(got) == set(names) and await index.workers() == set(names)


BAD_CALLS = [
    ("add", ("w", [-1])),
    ("add", ("w", [1 << 64])),
    ("add", ("w", [True])),
    ("add", ("w", [1.0])),
    ("add", ("w", "123")),
    ("add", ("", [1])),
    ("add", (5, [1])),
    ("add", ("x" * 300, [1])),
    ("add", ("w", [1], "GPU")),
    ("add", ("w", [1], "cpu,gpu")),
    ("add", ("w", [1], "")),
    ("remove", ("w", [-5])),
    ("remove", ("w", [1], "a|b")),
    ("clear", ("",)),
    ("lookup", ([1, "2"],)),
    ("lookup", ([1], "worker")),
    ("lookup", ([1], [""])),
]


@pytest.mark.parametrize(("method", "args"), BAD_CALLS, ids=[f"{m}{a!r:.30}" for m, a in BAD_CALLS])
async def test_bad_input_is_refused_the_same_way(backend, method, args):
    index = backend.new()
    with pytest.raises(InvalidArgument) as info:
        await getattr(index, method)(*args)
    assert info.value.field in {"keys", "worker", "workers", "tier"}
    assert await index.workers() == frozenset()


@pytest.mark.parametrize("bad", [-1, 1 << 64, True, 2.0])
async def test_an_add_with_a_bad_key_late_in_it_changes_nothing(backend, bad):
    # The memory index's compiled table checks every key before the first change.
    index = backend.new()
    await index.add("w", [1, 2])
    with pytest.raises(InvalidArgument, match=r"keys\[40\]"):
        await index.add("v", [*range(3, 43), bad])
    assert await index.lookup([1, 2, 3]) == {"w": run("w", (2, GPU))}
    assert await index.workers() == {"w"}


# A bad key after, or among, keys the index holds: the memory index checks the range only past
# its held prefix and types everywhere; every backend names the first bad key's position.
HELD_THEN_BAD = [
    ([1, 2, 1 << 64], "keys[2]"),
    ([1, 2, 3, -1, 2], "keys[3]"),
    ([1, True], "keys[1]"),
    ([1, 2.0], "keys[1]"),
    ([TOP, -TOP], "keys[1]"),
]


@pytest.mark.parametrize(("keys", "named"), HELD_THEN_BAD, ids=[n for _, n in HELD_THEN_BAD])
async def test_a_bad_key_past_held_keys_is_refused_by_its_position(backend, keys, named):
    index = backend.new()
    await index.add("w", [1, 2, TOP])
    with pytest.raises(InvalidArgument, match="^" + re.escape(named) + " must be") as info:
        await index.lookup(keys)
    assert info.value.field == "keys"
    assert (await index.lookup([1, 2]))["w"].blocks == 2


def test_medium_maps_to_tier():
    assert medium_tier(None) == "gpu"
    assert medium_tier("GPU") == "gpu" and medium_tier("CPU") == "cpu"
    assert medium_tier("STORAGE") == "storage"
    with pytest.raises(InvalidArgument, match="tier"):
        medium_tier("GPU,CPU")


# --------------------------------------------------------------------- model-based property test


class Model:
    """The obvious reference: a set of (worker, tier, key) facts."""

    def __init__(self) -> None:
        self.facts: set[tuple[str, str, int]] = set()

    def apply(self, op: tuple) -> None:
        kind, worker, keys, tier = op
        if kind == "add":
            self.facts |= {(worker, tier, k) for k in keys}
        elif kind == "remove":
            self.facts -= {(worker, tier, k) for k in keys}
        else:
            self.facts = {f for f in self.facts if f[0] != worker}

    def lookup(self, keys: list[int]) -> dict[str, PrefixMatch]:
        out = {}
        for worker in {f[0] for f in self.facts}:
            segments: list[list] = []
            for key in keys:
                tiers = tuple(sorted(t for w, t, k in self.facts if w == worker and k == key))
                if not tiers:
                    break
                if segments and segments[-1][1] == tiers:
                    segments[-1][0] += 1
                else:
                    segments.append([1, tiers])
            if segments:
                out[worker] = PrefixMatch(worker, tuple((c, t) for c, t in segments))
        return out


WORKERS = st.sampled_from(["w1", "w2", "w3"])
TIERS = st.sampled_from(["gpu", "cpu"])
KEYS = st.lists(st.integers(0, 7), max_size=6)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), WORKERS, KEYS, TIERS),
        st.tuples(st.just("remove"), WORKERS, KEYS, TIERS),
        st.tuples(st.just("clear"), WORKERS, st.just([]), st.just("gpu")),
    ),
    max_size=25,
)
PROMPTS = st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=6), min_size=1, max_size=4)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS, prompts=PROMPTS)
async def test_random_updates_match_the_reference_model(backend, ops, prompts):
    index = backend.new()
    model = Model()
    for op in ops:
        kind, worker, keys, tier = op
        if kind == "clear":
            await index.clear(worker)
        else:
            await getattr(index, kind)(worker, keys, tier)
        model.apply(op)
    for prompt in prompts:
        assert await index.lookup(prompt) == model.lookup(prompt)
    assert await index.workers() == {f[0] for f in model.facts}
