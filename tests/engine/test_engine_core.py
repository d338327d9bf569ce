"""Simulated engine: prefix reuse, usage, simulated TTFT, event timing, eviction and reset.

Event timing reference: vLLM 0.33 v1 scheduler (one batch per step with events; BlockStored
when blocks fill, decode-filled blocks included; BlockRemoved on reallocation of a cached
block; AllBlocksCleared on reset), see ../shared/reference/engines/vllm.md §4.3.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass

import pytest

from tokenkeys.engine.protocol import GenerationParams
from tokenkeys.engine.simulated.engine import SimulatedEngine
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.errors import ConfigError, ContextLengthExceeded, InvalidArgument, LimitExceeded
from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

BS = 4


@dataclass(frozen=True)
class StandInKey:
    """TEST STAND-IN for ``tokenkeys.keys.BlockKey``; not a real cache-key profile."""

    digest: bytes
    event_key: int


def standin_block_keys(tokens, context=None, block_size=BS):
    """TEST STAND-IN key function: sha256 chained over little-endian u32 token ids."""
    parent = b"\x00" * 32
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hashlib.sha256(parent)
        if context is not None:
            h.update(repr(context).encode())
        h.update(b"".join(t.to_bytes(4, "little") for t in tokens[start : start + block_size]))
        parent = h.digest()
        out.append(StandInKey(parent, int.from_bytes(parent[-8:], "big")))
    return out


def make_engine(num_blocks=64, **kw):
    batches: list[EventBatch] = []
    engine = SimulatedEngine(
        key_fn=standin_block_keys,
        block_size=BS,
        num_blocks=num_blocks,
        event_sink=batches.append,
        clock=lambda: 1234.5,
        **kw,
    )
    return engine, batches


async def run(engine, prompt, max_tokens=4, **kw):
    outs = [o async for o in engine.generate(prompt, GenerationParams(max_tokens=max_tokens), **kw)]
    return outs


def events_of(batches, kind=None):
    out = [e for b in batches for e in b.events]
    return [e for e in out if kind is None or isinstance(e, kind)]


async def test_same_prompt_twice_hits_the_cache_and_shortens_simulated_ttft():
    engine, _ = make_engine()
    prompt = list(range(100, 140))  # 40 tokens = 10 blocks
    first = (await run(engine, prompt))[-1]
    second = (await run(engine, prompt))[-1]
    assert first.usage.cached_prompt_tokens == 0
    # vLLM computes at least the last prompt token: 9 of 10 blocks hit.
    assert second.usage.cached_prompt_tokens == 36
    assert second.usage.prompt_tokens == 40 and second.usage.completion_tokens == 4
    assert second.timing.ttft_s < first.timing.ttft_s
    lat = engine.latency
    assert first.timing.ttft_s == pytest.approx(lat.time_to_first_token(40))
    assert second.timing.ttft_s == pytest.approx(lat.time_to_first_token(4))
    assert engine.stats.cached_prompt_tokens == 36


async def test_outputs_stream_one_token_each_with_usage_on_the_last():
    engine, _ = make_engine()
    outs = await run(engine, [1, 2, 3], max_tokens=5)
    assert [len(o.token_ids) for o in outs] == [1] * 5
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert all(o.usage is None for o in outs[:-1])
    assert outs[-1].finish_reason == "length" and outs[-1].usage.total_tokens == 8
    assert len({o.request_id for o in outs}) == 1


async def test_stored_hashes_equal_the_key_function_including_decode_filled_blocks():
    engine, batches = make_engine()
    prompt = [7, 8, 9, 10, 11, 12]
    outs = await run(engine, prompt, max_tokens=8, context="salt-A")
    tokens = prompt + [o.token_ids[0] for o in outs]
    keys = standin_block_keys(tokens, "salt-A")
    stored = events_of(batches, BlockStored)
    # KV exists for 6 + 8 - 1 = 13 tokens: 3 full blocks; block 0 at prefill, 1 and 2 in decode.
    assert [e.block_hashes for e in stored] == [(k.event_key,) for k in keys[:3]]
    assert [e.parent_block_hash for e in stored] == [None, keys[0].event_key, keys[1].event_key]
    assert [e.token_ids for e in stored] == [tuple(tokens[i * BS : (i + 1) * BS]) for i in range(3)]
    assert all(e.block_size == BS and e.medium == "GPU" and e.group_idx == 0 for e in stored)
    assert all(e.kv_cache_spec_kind == "full_attention" for e in stored)
    assert all(len(b.events) == 1 and b.ts == 1234.5 for b in batches)  # one batch per step


async def test_prefill_stores_all_full_prompt_blocks_in_one_event():
    engine, batches = make_engine()
    prompt = list(range(10))
    await run(engine, prompt, max_tokens=1)
    (event,) = events_of(batches)
    keys = standin_block_keys(prompt)
    assert event.block_hashes == tuple(k.event_key for k in keys)
    assert event.token_ids == tuple(range(8)) and event.parent_block_hash is None


async def test_hit_then_new_blocks_chain_from_the_last_hit():
    engine, batches = make_engine()
    base = list(range(12))
    await run(engine, base, max_tokens=1)
    batches.clear()
    longer = base + [50, 51, 52, 53, 54]
    out = (await run(engine, longer, max_tokens=1))[-1]
    assert out.usage.cached_prompt_tokens == 12
    (event,) = events_of(batches)
    keys = standin_block_keys(longer)
    assert event.parent_block_hash == keys[2].event_key
    assert event.block_hashes == (keys[3].event_key,)


async def test_block_aligned_prompt_recomputes_and_restores_its_last_block():
    engine, batches = make_engine()
    prompt = list(range(8))
    await run(engine, prompt, max_tokens=1)
    batches.clear()
    out = (await run(engine, prompt, max_tokens=1))[-1]
    assert out.usage.cached_prompt_tokens == 4
    keys = standin_block_keys(prompt)
    # Like vLLM, the recomputed block is stored again (no de-duplication).
    assert events_of(batches) == [
        BlockStored(
            (keys[1].event_key,),
            keys[0].event_key,
            tuple(range(4, 8)),
            BS,
            medium="GPU",
            extra_keys=(None,),
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        )
    ]


async def test_eviction_under_capacity_pressure_emits_block_removed_in_lru_order():
    engine, batches = make_engine(num_blocks=4)
    a, b, c = list(range(0, 8)), list(range(100, 108)), list(range(200, 216))
    await run(engine, a, max_tokens=1)  # blocks 0,1; freed tail first: A1, A0
    await run(engine, b, max_tokens=1)  # blocks 2,3 (never used); freed: B1, B0
    batches.clear()
    await run(engine, c, max_tokens=1)  # needs all 4 blocks
    (step,) = batches
    ka, kb = standin_block_keys(a), standin_block_keys(b)
    removed = [e for e in step.events if isinstance(e, BlockRemoved)]
    assert [e.block_hashes for e in removed] == [
        (ka[1].event_key,),
        (ka[0].event_key,),
        (kb[1].event_key,),
        (kb[0].event_key,),
    ]
    assert all(e.medium == "GPU" and e.group_idx == 0 for e in removed)
    # Evictions happen at allocation, before the new blocks are stored, in the same step.
    assert isinstance(step.events[-1], BlockStored) and len(step.events) == 5
    assert engine.cache.evictions == 4


async def test_reset_emits_all_blocks_cleared_and_is_refused_while_running():
    engine, batches = make_engine()
    await run(engine, list(range(8)))
    gen = engine.generate(list(range(20, 30)), GenerationParams(max_tokens=3))
    await gen.__anext__()
    batches.clear()
    assert engine.reset_prefix_cache() is False
    assert batches == []
    await gen.aclose()
    assert engine.reset_prefix_cache() is True
    assert batches == [EventBatch(1234.5, (AllBlocksCleared(),))]
    out = (await run(engine, list(range(8))))[-1]
    assert out.usage.cached_prompt_tokens == 0


async def test_abandoned_request_releases_its_blocks():
    engine, _ = make_engine(num_blocks=8)
    gen = engine.generate(list(range(12)), GenerationParams(max_tokens=8))
    await gen.__anext__()
    assert engine.cache.num_free_blocks < 8
    await gen.aclose()
    assert engine.cache.num_free_blocks == 8


async def test_request_waits_for_blocks_held_by_a_running_request():
    engine, _ = make_engine(num_blocks=4)
    holder = engine.generate(list(range(12)), GenerationParams(max_tokens=2))  # needs 4 blocks
    await holder.__anext__()
    waiter = asyncio.ensure_future(run(engine, [500, 501, 502, 503], max_tokens=1))
    for _ in range(1000):  # until the waiter has asked for its blocks and been put off
        if engine.stats.waiting == 1 or waiter.done():
            break
        await asyncio.sleep(0)
    assert engine.stats.waiting == 1 and not waiter.done()
    async for _ in holder:
        pass
    out = (await waiter)[-1]
    assert out.usage.prompt_tokens == 4


async def test_output_tokens_are_deterministic_per_prompt_and_seed():
    engine, _ = make_engine(output_vocab=range(50_000))

    async def tokens(prompt, seed):
        p = GenerationParams(max_tokens=6, seed=seed)
        return [o.token_ids[0] async for o in engine.generate(prompt, p)]

    assert await tokens([1, 2, 3], 7) == await tokens([1, 2, 3], 7)
    assert await tokens([1, 2, 3], 7) != await tokens([1, 2, 3], 8)
    assert await tokens([1, 2, 3], None) != await tokens([1, 2, 4], None)
    assert all(0 <= t < 50_000 for t in await tokens([9], 1))


async def test_stop_token_ends_the_request():
    engine, _ = make_engine(output_vocab=[5])
    outs = [
        o async for o in engine.generate([1], GenerationParams(max_tokens=9, stop_token_ids=(5,)))
    ]
    assert len(outs) == 1 and outs[0].finish_reason == "stop"


async def test_lora_and_event_extra_keys_are_reported():
    def extra(context, start, end):
        return ("Alice",) if context == "lora:Alice" else None

    engine, batches = make_engine(event_extra_keys=extra)
    await run(
        engine, list(range(8)), max_tokens=1, context="lora:Alice", lora_name="Alice", lora_id=1
    )
    (event,) = events_of(batches)
    assert event.lora_name == "Alice" and event.lora_id == 1
    assert event.extra_keys == (("Alice",), ("Alice",))


@pytest.mark.parametrize(
    ("prompt", "params", "error", "match"),
    [
        ([], GenerationParams(), InvalidArgument, "prompt_token_ids is empty"),
        ([1, -1], GenerationParams(), InvalidArgument, r"prompt_token_ids\[1\]"),
        ([1, 2**32], GenerationParams(), InvalidArgument, r"\[0, 2\*\*32\)"),
        ([1, True], GenerationParams(), InvalidArgument, r"prompt_token_ids\[1\]"),
        ([1], GenerationParams(max_tokens="2"), InvalidArgument, "max_tokens is '2'"),
        (list(range(40)), GenerationParams(max_tokens=1), LimitExceeded, "needs 10 KV blocks"),
        # vLLM 0.32's context rule in vLLM's words (engine/context_window.py, the rule the HTTP
        # frontend applies): max_tokens below 1 or past max_model_len, a prompt past it or
        # leaving no room, is refused; a prompt + max_tokens past it is fitted (test below).
        (
            [1],
            GenerationParams(max_tokens=0),
            InvalidArgument,
            re.escape("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
        ),
        (
            [1] * 64,
            GenerationParams(max_tokens=1),
            ContextLengthExceeded,
            re.escape("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
        ),
        (
            [1] * 65,
            GenerationParams(max_tokens=1),
            ContextLengthExceeded,
            re.escape(
                "This model's maximum context length is 64 tokens. However, your prompt "
                "contains at least 65 input tokens, which exceeds this limit even without any "
                "output tokens. Please reduce the length of the input prompt. "
                "(parameter=input_tokens, value=65)"
            ),
        ),
        (
            [1],
            GenerationParams(max_tokens=65),
            ContextLengthExceeded,
            re.escape(
                "max_tokens=65 cannot be greater than max_model_len=64. Please request fewer "
                "output tokens. (parameter=max_tokens, value=65)"
            ),
        ),
    ],
)
async def test_bad_requests_are_refused_with_a_clear_error(prompt, params, error, match):
    engine, _ = make_engine(num_blocks=8, max_model_len=64)
    with pytest.raises(error, match=match):
        [o async for o in engine.generate(prompt, params)]
    assert engine.cache.num_free_blocks == 8


async def test_max_tokens_past_the_context_is_fitted_to_the_room_left():
    engine, _ = make_engine(num_blocks=64, max_model_len=64)
    outputs = await run(engine, [1] * 60, max_tokens=10)
    assert outputs[-1].usage.completion_tokens == 4 and len(outputs) == 4


def test_latency_model():
    lat = LatencyModel(prefill_s_per_token=0.01, decode_s_per_token=0.1, overhead_s=1.0)
    assert lat.time_to_first_token(10) == pytest.approx(1.1)
    assert lat.inter_token() == 0.1
    with pytest.raises(ConfigError, match="prefill_s_per_token"):
        LatencyModel(prefill_s_per_token=-1)


async def test_total_simulated_time_counts_each_further_token():
    engine, _ = make_engine(latency=LatencyModel(0.001, 0.01, 0.0))
    out = (await run(engine, list(range(5)), max_tokens=3))[-1]
    assert out.timing.ttft_s == pytest.approx(0.005)
    assert out.timing.total_s == pytest.approx(0.025)


async def test_used_blocks_are_those_running_requests_hold_not_cached_free_ones():
    """GetLoad's ``used_kv_blocks``: a running request's blocks, its decode reservation
    included; once it finishes its cached blocks are free again (vLLM's ``get_usage``)."""
    engine, _ = make_engine(num_blocks=16)
    assert engine.used_blocks == 0
    # 10 prompt tokens + 6 output tokens (KV for 15): 4 blocks of 4, 3 allocated at prefill.
    gen = engine.generate(list(range(10)), GenerationParams(max_tokens=6))
    await gen.__anext__()
    assert engine.used_blocks == 4
    assert engine.cache.num_free_blocks == 16 - 3
    await gen.aclose()
    assert engine.used_blocks == 0
    assert engine.cache.num_cached_blocks == 2  # the prompt's full blocks stay findable


async def test_max_tokens_unset_is_the_engines_default_setting():
    # GenerationParams.max_tokens None: the simulated engine's --default-max-tokens (16 unless
    # set), fitted to the context like any budget.
    for setting, want in ((None, 16), (5, 5)):
        kw = {} if setting is None else {"default_max_tokens": setting}
        engine, _ = make_engine(**kw)
        outs = [o async for o in engine.generate([1, 2, 3], GenerationParams(seed=1))]
        assert outs[-1].usage.completion_tokens == want
    engine, _ = make_engine(max_model_len=10)
    outs = [o async for o in engine.generate(list(range(1, 8)), GenerationParams())]
    assert outs[-1].usage.completion_tokens == 3 and outs[-1].finish_reason == "length"
