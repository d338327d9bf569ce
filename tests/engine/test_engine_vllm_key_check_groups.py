"""The live key check on a hybrid model: every KV-cache group's stored blocks placed and checked.

Events are built in the layout vLLM 0.32 published for a tiny Gemma 3 (4 layers alternating a
64-token sliding window and full attention, 32-token blocks; issue 25 and
``tests/realengine/test_vllm_hybrid.py``): for a 490-token prompt group 1 (full attention)
stored blocks 0-14, group 0 (sliding window) the hashes of blocks 13 and 14 only, both with the
same 480 token ids and no parent; a follow-up sharing those 480 tokens stored blocks 15-19 and
18-19, both with parent block 14 and 160 token ids.
"""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry

from tokenkeys.engine.vllm.key_check import KeyCheck, keys_checked
from tokenkeys.events.model import BlockStored, EventBatch, hashed_offset
from tokenkeys.keys import block_keys, make_spec

BS = 32
GROUPS = [
    {"kind": "sliding_window", "block_size": BS, "sliding_window": 64},
    {"kind": "full_attention", "block_size": BS},
]
SPEC = make_spec("vllm/sha256_cbor@0.31", BS, groups=GROUPS)
WRONG_ROOT = make_spec("vllm/sha256_cbor@0.31", BS, root_seed="999", groups=GROUPS)


def _check() -> tuple[KeyCheck, CollectorRegistry]:
    registry = CollectorRegistry()
    return KeyCheck(SPEC, "m", keys_checked(registry)), registry


def _counts(registry: CollectorRegistry) -> tuple[float, float]:
    def one(result: str) -> float:
        labels = {"model": "m", "result": result}
        return registry.get_sample_value("tokenkeys_engine_keys_checked_total", labels) or 0.0

    return one("match"), one("mismatch")


def _tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(49152) for _ in range(length)]


def _event(prompt, first, end, kept, group, spec=SPEC) -> BlockStored:  # noqa: ANN001
    """Blocks ``first..end`` newly full; the group hashes ``kept`` of them (positions)."""
    keys = block_keys(prompt, spec)
    return BlockStored(
        tuple(keys[i].event_key for i in kept),
        keys[first - 1].event_key if first else None,
        tuple(prompt[first * BS : end * BS]),
        BS,
        group_idx=group,
        kv_cache_spec_kind="sliding_window" if group == 0 else "full_attention",
        kv_cache_spec_sliding_window=64 if group == 0 else None,
    )


def _issue_batches(prompt, spec=SPEC) -> list[EventBatch]:  # noqa: ANN001
    return [
        EventBatch(
            0.0,
            (
                _event(prompt, 0, 15, [13, 14], 0, spec),
                _event(prompt, 0, 15, range(15), 1, spec),
            ),
        ),
        EventBatch(
            0.0,
            (
                _event(prompt, 15, 20, [18, 19], 0, spec),
                _event(prompt, 15, 20, range(15, 20), 1, spec),
            ),
        ),
    ]


def test_a_window_groups_hashes_key_the_tail_of_its_span() -> None:
    prompt = _tokens(1, 650)
    window = _event(prompt, 0, 15, [13, 14], 0)
    assert hashed_offset(window) == 13
    assert hashed_offset(_event(prompt, 0, 15, range(15), 1)) == 0
    ragged = BlockStored((1, 2), None, tuple(prompt[:40]), BS)
    assert hashed_offset(ragged) is None


def test_every_groups_blocks_match_on_the_issues_workload() -> None:
    check, registry = _check()
    prompt = _tokens(2, 650)
    check.expect(prompt[:490], None)
    first, second = _issue_batches(prompt)
    check.observe(first)
    assert _counts(registry) == (15 + 2, 0)
    check.expect(prompt, None)
    check.observe(second)
    assert _counts(registry) == (17 + 5 + 2, 0)
    assert check.verified


def test_a_wrong_root_is_caught_in_the_window_group_too() -> None:
    check, registry = _check()
    prompt = _tokens(3, 490)
    check.expect(prompt, None)
    window = EventBatch(0.0, (_event(prompt, 0, 15, [13, 14], 0, WRONG_ROOT),))
    check.observe(window)
    assert _counts(registry) == (0, 2)
    assert not check.verified


def test_a_window_keeping_other_blocks_than_the_tail_counts_neither_way() -> None:
    # vLLM's sparse retention (block_mask) may keep a head block too: not placed, no alarm.
    check, registry = _check()
    prompt = _tokens(4, 490)
    check.expect(prompt, None)
    check.observe(EventBatch(0.0, (_event(prompt, 0, 15, [3, 14], 0),)))
    assert _counts(registry) == (0, 0)
    assert check.verified


def test_a_group_the_spec_does_not_have_is_a_mismatch_of_the_layout() -> None:
    check, registry = _check()
    prompt = _tokens(5, 100)
    check.expect(prompt, None)
    check.observe(EventBatch(0.0, (_event(prompt, 0, 3, range(3), 2),)))
    assert _counts(registry) == (0, 1)
    assert "group 2" in (check.first_mismatch or "")


def test_a_window_event_of_a_prompt_not_remembered_is_not_counted() -> None:
    check, registry = _check()
    prompt = _tokens(6, 490)
    check.observe(_issue_batches(prompt + _tokens(7, 160))[0])
    assert _counts(registry) == (0, 0)
