"""What a hybrid engine resumes (``router.index.hybrid``), on every prefix-index backend.

The reference is vLLM 0.32's rule written out block by block over plain sets
(``vllm/v1/core/kv_cache_coordinator.py`` ``HybridKVCacheCoordinator.find_longest_cache_hit``,
``single_type_kv_cache_manager.py`` ``FullAttentionManager`` / ``SlidingWindowManager``
``find_longest_cache_hit``): a property test compares it with :func:`resumable_matches` over
random residencies, and the named cases are the shapes the real engine produced
(``tests/realengine/test_vllm_hybrid.py``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkeys.router.index.hybrid import (
    GroupLayout,
    WindowGroup,
    group_key,
    resumable_matches,
)

BS = 32
SWA, FA = 0, 1  # vLLM's group order for Gemma 3: sliding window first
LAYOUT = GroupLayout(FA, BS, (WindowGroup(SWA, 64, BS),))
KEYS = [1000 + i for i in range(20)]


def reference_hit(full: set[int], windows: dict[int, set[int]], num_tokens: int) -> int:
    """vLLM's hit in blocks for block positions held per group (full attention, windows)."""
    need = {g: max(1, -(-(w.window - 1) // BS)) for g, w in ((w.index, w) for w in LAYOUT.windows)}
    hit = (num_tokens - 1) // BS
    while True:
        current = hit
        run = 0
        while run < current and run in full:
            run += 1
        current = run
        for group, held in windows.items():
            found = None
            contiguous = 0
            for i in range(current - 1, -1, -1):
                if i in held:
                    contiguous += 1
                    if contiguous >= need[group]:
                        found = i + contiguous
                        break
                else:
                    contiguous = 0
            current = found if found is not None else contiguous
        if current >= hit:
            return hit
        hit = current


async def fill(index, worker: str, full: set[int], windows: dict[int, set[int]]) -> None:
    await index.add(worker, [KEYS[i] for i in sorted(full)])
    for group, held in windows.items():
        await index.add(worker, [group_key(KEYS[i], group, FA) for i in sorted(held)])


async def test_the_window_group_keys_are_its_own_and_the_routing_group_keeps_event_keys():
    assert group_key(7, FA, FA) == 7
    assert group_key(7, SWA, FA) != 7
    assert len({group_key(k, SWA, FA) for k in KEYS} | set(KEYS)) == 2 * len(KEYS)


async def test_the_first_prompt_of_the_issue_resumes_to_the_window_it_stored(backend):
    # vLLM 0.32 on a 490-token prompt: full attention stored blocks 0-14, the window group only
    # blocks 13 and 14; a prompt sharing those 480 tokens resumes all 15 blocks.
    index = backend.new()
    await fill(index, "w", set(range(15)), {SWA: {13, 14}})
    got = await resumable_matches(index, KEYS[:20], 650, LAYOUT)
    assert got["w"].blocks == 15


async def test_a_window_evicted_under_the_hit_ends_it_at_the_window_before(backend):
    index = backend.new()
    # Window blocks 13 and 14 gone, 9 and 10 left: vLLM resumes 11 blocks, not 15.
    await fill(index, "w", set(range(15)), {SWA: {9, 10}})
    got = await resumable_matches(index, KEYS[:20], 650, LAYOUT)
    assert got["w"].blocks == 11
    # One block of a window is not a window: only block 0 onwards would count, and it is gone.
    await index.clear("w")
    await fill(index, "w", set(range(15)), {SWA: {12}})
    assert await resumable_matches(index, KEYS[:20], 650, LAYOUT) == {}


async def test_without_a_window_the_blocks_from_the_start_count(backend):
    index = backend.new()
    await fill(index, "w", set(range(15)), {SWA: {0}})
    assert (await resumable_matches(index, KEYS, 650, LAYOUT))["w"].blocks == 1


async def test_the_last_token_is_always_recomputed(backend):
    # A prompt of exactly 15 blocks resumes 14 at most (max_cache_hit_length = tokens - 1).
    index = backend.new()
    await fill(index, "w", set(range(15)), {SWA: set(range(15))})
    assert (await resumable_matches(index, KEYS[:15], 15 * BS, LAYOUT))["w"].blocks == 14


async def test_a_model_of_one_group_keeps_lookups_meaning(backend):
    index = backend.new()
    await index.add("w", KEYS[:15])
    plain = GroupLayout(0, BS)
    got = await resumable_matches(index, KEYS[:15], 15 * BS, plain)
    assert got == await index.lookup(KEYS[:15])


positions = st.sets(st.integers(0, 19), max_size=20)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    workers=st.lists(st.tuples(positions, positions), min_size=1, max_size=3),
    num_tokens=st.integers(1, 20 * BS + 5),
)
async def test_the_hit_is_vllms_for_any_residency(backend, workers, num_tokens):
    index = backend.new()
    expected = {}
    for n, (full, window) in enumerate(workers):
        name = f"w{n}"
        await fill(index, name, full, {SWA: window})
        hit = reference_hit(full, {SWA: window}, num_tokens)
        if hit:
            expected[name] = hit
    keys = KEYS[: min(20, num_tokens // BS)]
    got = await resumable_matches(index, keys, num_tokens, LAYOUT)
    assert {w: m.blocks for w, m in got.items()} == expected
    await index.close()


@pytest.mark.parametrize("window", [32, 33, 64, 65, 128])
def test_a_hit_needs_the_blocks_the_window_reaches(window):
    # cdiv(window - 1, block_size): a 64-token window needs 2 blocks, a 65-token one 2, 128 4.
    assert WindowGroup(0, window, BS).need == max(1, -(-(window - 1) // BS))
