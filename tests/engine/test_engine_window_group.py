"""The simulated engine with a hybrid layout: a sliding-window group beside full attention.

The expectations are what vLLM 0.32 did for the tiny Gemma 3 of ``tests/realengine`` (a 64-token
window, 32-token blocks; ``test_vllm_hybrid.py``): a 490-token prompt stores blocks 0-14 in full
attention and the window's blocks 13-14 with the same 480 token ids; a follow-up sharing those
480 tokens resumes all of them and stores 15-19 and 18-19 from parent block 14. A shared prefix
whose window blocks are gone is not resumed. The block size here is ``test_engine_core``'s, the
window two blocks, as 64 tokens are two of vLLM's 32-token blocks.
"""

from __future__ import annotations

import pytest
from test_engine_core import BS, events_of, make_engine, run

from tokenkeys.engine.simulated.local import simulated_groups
from tokenkeys.errors import ConfigError
from tokenkeys.events.model import BlockStored
from tokenkeys.keys import make_spec

WINDOW, FULL = 0, 1


def hybrid(num_blocks=256):  # noqa: ANN001, ANN201
    return make_engine(
        num_blocks, group_idx=FULL, windows=[(WINDOW, 2 * BS)], kv_cache_spec_kind="full_attention"
    )


def stored(batches, group):  # noqa: ANN001, ANN201
    return [e for e in events_of(batches, BlockStored) if e.group_idx == group]


async def test_the_window_group_stores_the_tail_of_the_prompt_as_vllm_does():
    engine, batches = hybrid()
    bs = engine.block_size
    prefix = list(range(1000, 1000 + 15 * bs))
    await run(engine, prefix + [7, 7], max_tokens=1)
    full, window = stored(batches, FULL), stored(batches, WINDOW)
    assert len(full[0].block_hashes) == 15
    assert list(window[0].block_hashes) == list(full[0].block_hashes[13:15])
    assert window[0].token_ids == full[0].token_ids and window[0].parent_block_hash is None
    assert (window[0].kv_cache_spec_kind, window[0].kv_cache_spec_sliding_window) == (
        "sliding_window",
        2 * BS,
    )
    outs = await run(engine, prefix + [9] * (5 * bs + 2), max_tokens=1)
    assert outs[-1].usage.cached_prompt_tokens == 15 * bs
    assert list(stored(batches, WINDOW)[1].block_hashes) == list(
        stored(batches, FULL)[1].block_hashes[3:5]
    )
    assert stored(batches, WINDOW)[1].parent_block_hash == full[0].block_hashes[14]


async def test_a_shared_prefix_without_its_window_blocks_is_not_resumed():
    engine, _ = hybrid()
    bs = engine.block_size
    prefix = list(range(2000, 2000 + 10 * bs))
    await run(engine, prefix + list(range(5000, 5000 + 2 * bs + 3)), max_tokens=1)
    # Full attention holds the 10 prefix blocks, the window only blocks 10-11 of that prompt.
    outs = await run(engine, prefix + list(range(7000, 7000 + 2 * bs + 3)), max_tokens=1)
    assert outs[-1].usage.cached_prompt_tokens == 0


def test_the_simulated_layout_is_full_attention_with_windows_of_its_block_size():
    spec = make_spec(
        "vllm/sha256_cbor@0.31",
        32,
        groups=[
            {"kind": "sliding_window", "block_size": 32, "sliding_window": 64},
            {"kind": "full_attention", "block_size": 32},
        ],
    )
    group, windows = simulated_groups(spec)
    assert (group.index, windows) == (1, [(0, 64)])
    wider = make_spec(
        "vllm/sha256_cbor@0.31",
        32,
        groups=[
            {"kind": "sliding_window", "block_size": 64, "sliding_window": 64},
            {"kind": "full_attention", "block_size": 32},
        ],
    )
    with pytest.raises(ConfigError, match="group 0 has 64"):
        simulated_groups(wider)
