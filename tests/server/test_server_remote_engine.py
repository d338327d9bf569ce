"""``tokenkeys serve --engine HOST:PORT``: generation forwarded to an OpenEngine engine as token
ids, tested against a second tokenkeys process acting as that engine (real ports).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from engine_stack import ServeProcess, start_stack

from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys._gen.openengine.v1 import (
    kv_pb2,
    lifecycle_pb2,
    model_pb2,
    openengine_pb2_grpc,
    server_pb2,
)
from tokenkeys.engine.config import EngineConfig, RemoteConfig
from tokenkeys.engine.proto import TTFT_METADATA
from tokenkeys.engine.protocol import GenerationParams
from tokenkeys.engine.remote import RemoteEngine
from tokenkeys.errors import Unavailable
from tokenkeys.events.model import BlockStored
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.keys import KeyContext
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

# NUL handling differs on purpose: the frontend strips NUL (Dynamo style), the engine would keep
# it. Tokens the engine reports prove it received the frontend's token ids, not the text.
TEXT = "Routers tokenize once;\x00 engines receive token ids. " * 6


@pytest.fixture(scope="module")
def engine():
    with ServeProcess("--instance-id", "engine-1", "--lora-modules", "sql=/adapters/sql") as proc:
        yield proc


@pytest.fixture
async def frontend(engine):
    models = load_models([ModelSource.default()], TokenizerOptions(nul="strip"), Limits())
    stack = await start_stack(EngineConfig(engine=RemoteConfig(engine.target)), models=models)
    yield stack
    await stack.stop()


def tokens_of(messages) -> list[int]:
    return [t.token_id for m in messages if m.HasField("token") for t in m.token.tokens]


async def _engine_stored_tokens(engine, first_tokens: list[int]) -> list[int]:
    """Token ids of the first BlockStored on the engine's stream that starts with them."""
    codec = ProtobufEventCodec()
    async with grpc.aio.insecure_channel(engine.target) as channel:
        control = openengine_pb2_grpc.ControlStub(channel)
        call = control.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
        try:
            while True:
                message = await asyncio.wait_for(call.read(), 5)
                for event in codec.decode(message.batch)[1].events:
                    if (
                        isinstance(event, BlockStored)
                        and list(event.token_ids[: len(first_tokens)]) == first_tokens
                    ):
                        return list(event.token_ids)
        finally:
            call.cancel()


async def test_generation_is_forwarded_as_the_frontends_token_ids(engine, frontend):
    model = frontend.models.get(None)
    ids = model.preprocessor.tokenize_prompts([TEXT])[0].ids
    raw = load_models([ModelSource.default()], TokenizerOptions(), Limits()).get(None)
    assert raw.preprocessor.tokenize_prompts([TEXT])[0].ids != ids  # the engine's own reading
    before = (await frontend.control.GetLoad(server_pb2.GetLoadRequest())).timestamp_unix_nanos
    assert before > 0

    first, meta1 = await frontend.generate_call(
        prompt=TEXT, stopping=gen.StoppingOptions(max_tokens=4)
    )
    assert [m.WhichOneof("event") for m in first] == ["token"] * 4 + ["finished"]
    assert first[-1].usage.prompt_tokens == len(ids)
    assert first[-1].usage.cached_prompt_tokens == 0
    sources = await frontend.control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
    grpc_source = [s for s in sources.sources if s.transport == "grpc"][0]
    assert grpc_source.endpoint_addr.port == engine.port  # forwarded: the engine's own sources
    # The engine's first batch of this request holds the frontend's tokens.
    info = await frontend.control.GetServerInfo(server_pb2.GetServerInfoRequest())
    assert info.instance_id == "engine-1" and info.engine_name == "tokenkeys-sim"
    stored = await _engine_stored_tokens(engine, ids[:16])
    assert stored == ids[: len(ids) // 16 * 16]

    second, meta2 = await frontend.generate_call(
        prompt=TEXT, stopping=gen.StoppingOptions(max_tokens=4)
    )
    assert second[-1].usage.cached_prompt_tokens == (len(ids) - 1) // 16 * 16 > 0
    assert int(meta2[TTFT_METADATA]) < int(meta1[TTFT_METADATA])
    assert tokens_of(second) == tokens_of(first)  # same prompt, same default seed


async def test_model_info_combines_frontend_tokenizer_and_engine_key_spec(engine, frontend):
    info = await frontend.control.GetModelInfo(model_pb2.GetModelInfoRequest())
    async with grpc.aio.insecure_channel(engine.target) as channel:
        direct = await openengine_pb2_grpc.ControlStub(channel).GetModelInfo(
            model_pb2.GetModelInfoRequest()
        )
    assert info.tokenizer.fingerprint == frontend.models.get(None).tokenizer.fingerprint
    assert info.tokenizer.fingerprint != direct.tokenizer.fingerprint  # nul=strip differs
    assert info.tokenizer.key_spec == direct.tokenizer.key_spec
    assert info.supports_lora  # the engine's capabilities
    health = await frontend.control.Health(lifecycle_pb2.HealthRequest())
    assert health.state == lifecycle_pb2.HEALTH_STATE_READY


async def test_remote_engine_interface_matches_the_simulated_one(frontend):
    remote = frontend.models.get(None).engine
    assert isinstance(remote, RemoteEngine)
    ids = frontend.models.get(None).preprocessor.tokenize_prompts(["a b c " * 30])[0].ids
    outs = [
        o
        async for o in remote.generate(
            ids, GenerationParams(max_tokens=3, seed=5), KeyContext(cache_salt="t1")
        )
    ]
    assert [o.finished for o in outs] == [False, False, True]
    assert all(len(o.token_ids) == 1 for o in outs)
    assert outs[-1].finish_reason == "length"
    assert outs[-1].usage.prompt_tokens == len(ids) and outs[-1].usage.completion_tokens == 3
    assert outs[-1].timing is not None and outs[-1].timing.ttft_s > 0


async def test_engine_errors_come_back_with_their_status(frontend):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await frontend.generate(prompt="x", lora_name="unknown-adapter")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "sql" in info.value.details()  # the engine's list of adapters
    # Refusals happen at the frontend already.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await frontend.generate(prompt="x", guided=gen.GuidedDecoding(regex="a"))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_unreachable_engine_is_unavailable():
    stack = await start_stack(EngineConfig(engine=RemoteConfig("127.0.0.1:1")))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.generate(prompt="x")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "127.0.0.1:1" in info.value.details()
        health = await stack.control.Health(lifecycle_pb2.HealthRequest())
        assert health.state == lifecycle_pb2.HEALTH_STATE_NOT_READY
        with pytest.raises(Unavailable):
            remote = stack.models.get(None).engine
            async for _ in remote.generate([1, 2, 3]):
                pass
    finally:
        await stack.stop()
