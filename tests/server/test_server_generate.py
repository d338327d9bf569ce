"""Inference.Generate over a real loopback server: inputs, the stream shape, usage and cache
hits, simulated time to first token, and what the simulated engine refuses.

Stream shape per OpenEngine v1 (docs/api.md @4def7c5): TokenOutput messages with output_index
0, then one GenerationFinished carrying usage; failures before acceptance are gRPC statuses.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from engine_stack import GrpcEvents, start_stack

from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys.engine.config import EngineConfig, LoraModule, SimulatedConfig
from tokenkeys.engine.proto import TTFT_METADATA
from tokenkeys.engine.protocol import GenerationParams
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.keys import KeyContext

TEXT = "The quick brown fox jumps over the lazy dog. " * 8


@pytest.fixture
async def stack():
    s = await start_stack(
        EngineConfig(engine=SimulatedConfig(lora_modules=(LoraModule("sql", "/a/sql", 1),)))
    )
    yield s
    await s.stop()


def tokens_of(messages) -> list[int]:
    return [t.token_id for m in messages if m.HasField("token") for t in m.token.tokens]


async def test_stream_is_tokens_then_finished_with_usage_on_the_last_message_only(stack):
    messages = await stack.generate(prompt=TEXT, stopping=gen.StoppingOptions(max_tokens=5))
    kinds = [m.WhichOneof("event") for m in messages]
    assert kinds == ["token"] * 5 + ["finished"]
    assert all(m.token.HasField("output_index") and m.token.output_index == 0 for m in messages[:5])
    assert [m.HasField("usage") for m in messages] == [False] * 5 + [True]
    last = messages[-1]
    assert last.finished.reason == gen.FINISH_REASON_LENGTH
    assert last.finished.HasField("output_index") and last.finished.output_index == 0
    ids = stack.models.get(None).preprocessor.tokenize_prompts([TEXT])
    usage = last.usage
    assert usage.prompt_tokens == ids[0].count
    assert (usage.completion_tokens, usage.total_tokens) == (5, ids[0].count + 5)
    assert usage.HasField("cached_prompt_tokens") and usage.cached_prompt_tokens == 0
    assert len({m.request_id for m in messages}) == 1 and messages[0].request_id


async def test_text_is_tokenized_by_the_models_preprocessor(stack):
    ids = stack.models.get(None).preprocessor.tokenize_prompts([TEXT])[0].ids
    by_text = await stack.generate(prompt=TEXT, stopping=gen.StoppingOptions(max_tokens=3))
    events = GrpcEvents(stack)
    (batch,) = await events.batches(1)
    events.cancel()
    (stored,) = ProtobufEventCodec().decode(batch)[1].events
    assert list(stored.token_ids) == ids[: len(ids) // 16 * 16]
    by_ids = await stack.generate(
        token_ids=gen.TokenIds(ids=ids), stopping=gen.StoppingOptions(max_tokens=3)
    )
    # Same tokens, default seed: same output; and the second request hits the cache.
    assert tokens_of(by_ids) == tokens_of(by_text)
    assert by_ids[-1].usage.cached_prompt_tokens == (len(ids) - 1) // 16 * 16 > 0


async def test_prompt_sent_twice_is_cached_and_has_a_shorter_simulated_time_to_first_token(stack):
    first, meta1 = await stack.generate_call(prompt=TEXT)
    second, meta2 = await stack.generate_call(prompt=TEXT)
    assert first[-1].usage.cached_prompt_tokens == 0
    assert second[-1].usage.cached_prompt_tokens > 0
    assert int(meta2[TTFT_METADATA]) < int(meta1[TTFT_METADATA])
    latency = stack.local().engine.latency
    uncached = second[-1].usage.prompt_tokens - second[-1].usage.cached_prompt_tokens
    assert int(meta2[TTFT_METADATA]) == round(latency.time_to_first_token(uncached) * 1e6)


async def test_seed_and_stop_token(stack):
    a = tokens_of(await stack.generate(prompt=TEXT, sampling=gen.SamplingParams(seed=7)))
    b = tokens_of(await stack.generate(prompt=TEXT, sampling=gen.SamplingParams(seed=7)))
    c = tokens_of(await stack.generate(prompt=TEXT, sampling=gen.SamplingParams(seed=8)))
    assert a == b != c and len(a) == 16  # default max_tokens
    stop = a[3]
    messages = await stack.generate(
        prompt=TEXT,
        sampling=gen.SamplingParams(seed=7),
        stopping=gen.StoppingOptions(conditions=[gen.StopCondition(stop_token_id=stop)]),
    )
    out = tokens_of(messages)
    assert out == a[: a.index(stop) + 1]
    assert messages[-1].finished.reason == gen.FINISH_REASON_STOP
    assert messages[-1].finished.stop_match.stop_token_id == stop


async def test_output_tokens_are_never_special_tokens(stack):
    special = {a.id for a in stack.models.get(None).tokenizer.specials.added if a.special}
    out = tokens_of(await stack.generate(prompt=TEXT, stopping=gen.StoppingOptions(max_tokens=64)))
    assert out and not set(out) & special


@pytest.mark.parametrize(
    "fields,needle",
    [
        ({"media": [gen.MediaItem(url="http://x/cat.png")]}, "media"),
        ({"guided": gen.GuidedDecoding(regex="a+")}, "guided.regex"),
        ({"response": gen.ResponseOptions(return_output_logprobs=True)}, "logprobs"),
        ({"response": gen.ResponseOptions(prompt_candidates={"top_n": 2})}, "logprobs"),
        ({"sampling": gen.SamplingParams(num_sequences=2)}, "num_sequences"),
        ({"stopping": gen.StoppingOptions(min_tokens=3)}, "min_tokens"),
        (
            {"stopping": gen.StoppingOptions(conditions=[gen.StopCondition(stop_text="x")])},
            "stop strings",
        ),
        ({"kv": gen.KvOptions(session={"session_id": "s"})}, "kv.session"),
        ({"kv": gen.KvOptions(bypass_prefix_cache=True)}, "bypass"),
    ],
)
async def test_what_the_simulated_engine_cannot_honour_is_unimplemented(stack, fields, needle):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.generate(prompt="hi", **fields)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert needle in info.value.details()
    assert stack.local().engine.stats.requests == 0


async def test_accepted_but_ignored_options(stack):
    messages = await stack.generate(
        prompt="hi",
        sampling=gen.SamplingParams(temperature=0.7, top_p=0.9, num_sequences=1),
        response=gen.ResponseOptions(return_output_logprobs=False),
        stopping=gen.StoppingOptions(max_tokens=2, ignore_eos=True),
    )
    assert messages[-1].usage.completion_tokens == 2


@pytest.mark.parametrize(
    "fields,code,needle",
    [
        ({}, grpc.StatusCode.INVALID_ARGUMENT, "no input"),
        ({"token_ids": gen.TokenIds(ids=[])}, grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        ({"token_ids": gen.TokenIds(ids=[1, 10**6])}, grpc.StatusCode.INVALID_ARGUMENT, "vocab"),
        ({"prompt": "x", "model": "gpt-9"}, grpc.StatusCode.NOT_FOUND, "smollm2"),
        ({"prompt": "x", "lora_name": "nope"}, grpc.StatusCode.NOT_FOUND, "sql"),
        (
            {"prompt": "x", "kv": gen.KvOptions(cache_salt="a/b")},
            grpc.StatusCode.INVALID_ARGUMENT,
            "'/'",
        ),
        (
            {"prompt": "x", "stopping": gen.StoppingOptions(max_tokens=0)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "max_tokens",
        ),
        (
            {"prompt": "x", "stopping": gen.StoppingOptions(max_tokens=9000)},
            grpc.StatusCode.INVALID_ARGUMENT,
            # vLLM's words, as the HTTP frontend's (engine/context_window.py)
            "max_tokens=9000 cannot be greater than max_model_len=8192.",
        ),
        (
            {"prompt": "x", "sampling": gen.SamplingParams(num_sequences=0)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "num_sequences",
        ),
    ],
)
async def test_bad_requests_are_refused_before_acceptance(stack, fields, code, needle):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.generate(**fields)
    assert info.value.code() == code, info.value.details()
    assert needle in info.value.details()


async def test_the_context_rule_is_vllms_in_vllms_words_over_grpc():
    """Generate goes through the one context rule (engine/context_window.py) the HTTP frontend
    applies: a prompt past max_model_len is INVALID_ARGUMENT (vLLM's 400) in vLLM's words; a
    prompt plus max_tokens past it is fitted to the room left, not refused."""
    stack = await start_stack(EngineConfig(max_model_len=32))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.generate(token_ids=gen.TokenIds(ids=[1] * 40))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith(
            "This model's maximum context length is 32 tokens. However, your prompt contains "
            "40 input tokens"
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.generate(token_ids=gen.TokenIds(ids=[1] * 32))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == (
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
        )
        messages = await stack.generate(
            token_ids=gen.TokenIds(ids=[1] * 30), stopping=gen.StoppingOptions(max_tokens=10)
        )
        assert messages[-1].usage.completion_tokens == 2
        assert messages[-1].finished.reason == gen.FINISH_REASON_LENGTH
    finally:
        await stack.stop()


async def test_capacity_too_small_for_a_request_is_resource_exhausted():
    stack = await start_stack(EngineConfig(engine=SimulatedConfig(num_kv_blocks=2)))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.generate(prompt=TEXT)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "KV blocks" in info.value.details()
    finally:
        await stack.stop()


async def test_lora_adapter_is_resolved_to_its_registered_path_and_id(stack):
    engine = stack.local()
    ctx, name, lora_id = engine.resolve(None, "sql", None)
    assert (ctx.adapter.name, ctx.adapter.path, name, lora_id) == ("sql", "/a/sql", "sql", 1)
    with pytest.raises(Exception, match="registered with path"):
        engine.resolve(KeyContext(adapter=type(ctx.adapter)("sql", "/elsewhere")), None, None)


async def test_the_extension_engine_is_what_the_http_routes_call(stack):
    """``model.engine.generate(ids, GenerationParams, KeyContext)`` as Engine.generate."""
    engine = stack.models.get(None).engine
    ids = stack.models.get(None).preprocessor.tokenize_prompts([TEXT])[0].ids
    outs = [o async for o in engine.generate(ids, GenerationParams(max_tokens=3), KeyContext())]
    assert [o.finished for o in outs] == [False, False, True]
    assert outs[-1].usage.prompt_tokens == len(ids) and outs[-1].timing is not None


async def test_a_client_that_goes_away_releases_its_kv_blocks():
    stack = await start_stack(
        EngineConfig(
            engine=SimulatedConfig(latency=LatencyModel(decode_s_per_token=0.01, sleep=True))
        )
    )
    try:
        call = stack.inference.Generate(
            gen.GenerateRequest(prompt=TEXT, stopping=gen.StoppingOptions(max_tokens=500))
        )
        await call.read()
        engine = stack.local().engine
        assert engine.stats.running == 1
        assert engine.cache.num_free_blocks < engine.num_blocks
        call.cancel()
        for _ in range(200):
            if engine.stats.running == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.stats.running == 0
        assert engine.cache.num_free_blocks == engine.num_blocks
        assert engine.stats.requests == 0  # it never finished
    finally:
        await stack.stop()
