"""The KV-cache groups a sidecar reads off vLLM's events for its probe prompt.

The events are shaped as vLLM 0.32 published them for the probe on the tiny Gemma 3 of
``tests/realengine`` (``test_vllm_hybrid.py`` runs the whole start against it); here the layouts
it must refuse, naming them, and the spec it builds.
"""

from __future__ import annotations

import pytest

from tokenkeys.engine.vllm.groups import PROBE_BLOCKS, groups_of, probe_prompt, respec
from tokenkeys.errors import ConfigError
from tokenkeys.events.model import BlockStored
from tokenkeys.keys import KeyGroup, make_spec

BS = 32
TOKENS = tuple(range(PROBE_BLOCKS * BS))


def stored(group: int, kind: str | None, window: int | None = None, size: int = BS):
    return BlockStored(
        (1, 2),
        None,
        TOKENS,
        size,
        group_idx=group,
        kv_cache_spec_kind=kind,
        kv_cache_spec_sliding_window=window,
    )


def test_the_groups_of_a_gemma_3_are_a_window_and_full_attention() -> None:
    events = [stored(0, "sliding_window", 64), stored(1, "full_attention")]
    assert groups_of(events, BS, "vllm") == (
        KeyGroup(0, BS, "sliding_window", sliding_window=64),
        KeyGroup(1, BS, "full_attention"),
    )


@pytest.mark.parametrize(
    ("events", "named"),
    [
        ([stored(0, "mamba"), stored(1, "full_attention")], "group 0 of kind 'mamba'"),
        ([stored(0, "sliding_window")], "without its window"),
        ([stored(0, "full_attention"), stored(2, "full_attention")], r"groups \[0, 2\]"),
        ([stored(0, "full_attention", size=48)], "48-token blocks in group 0"),
    ],
)
def test_a_layout_that_cannot_be_described_refuses_the_start(events, named) -> None:
    with pytest.raises(ConfigError, match=named):
        groups_of(events, BS, "vllm")


def test_the_learned_spec_keeps_profile_unit_and_root() -> None:
    base = make_spec("vllm/sha256_cbor@0.31", BS, root_seed="7")
    groups = groups_of([stored(0, "sliding_window", 64), stored(1, "full_attention")], BS, "v")
    spec = respec(base, groups)
    assert (spec.profile_id, spec.hash_unit, spec.root_hex) == (
        base.profile_id,
        base.hash_unit,
        base.root_hex,
    )
    assert spec.groups == groups
    assert spec.fingerprint != base.fingerprint


def test_the_probe_is_full_blocks_and_one_token_of_ids_in_the_vocabulary() -> None:
    prompt = probe_prompt(100, BS)
    assert len(prompt) == PROBE_BLOCKS * BS + 1
    assert all(0 <= t < 100 for t in prompt)
