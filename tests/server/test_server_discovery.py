"""Control discovery over a real loopback server: ServerInfo, ModelInfo's tokenizer
advertisement, KV-event sources (routable, each naming its key spec), load and health, and two
engines side by side.
"""

from __future__ import annotations

import dataclasses
import types

import grpc
import pytest
import zmq
import zmq.asyncio
from engine_stack import start_stack

from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys._gen.openengine.v1 import kv_pb2, lifecycle_pb2, model_pb2, server_pb2
from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as tpb
from tokenkeys.engine.config import EngineConfig, LoraModule, SimulatedConfig
from tokenkeys.engine.protocol import GenerationParams
from tokenkeys.events.zmq_endpoint import is_wildcard
from tokenkeys.keys import make_spec
from tokenkeys.server.runtime.discovery_messages import endpoint_of
from tokenkeys.server.runtime.engines import EngineRuntime


async def test_server_info_reports_engine_capacity_and_identity():
    stack = await start_stack(
        EngineConfig(engine=SimulatedConfig(num_kv_blocks=321), instance_id="worker-7")
    )
    try:
        info = await stack.control.GetServerInfo(server_pb2.GetServerInfoRequest())
        assert info.engine_name == "tokenkeys-sim"
        assert info.instance_id == "worker-7"
        assert list(info.supported_models) == stack.models.names
        assert info.capacity.kv_block_size == 16 and info.capacity.total_kv_blocks == 321
        assert info.engine_role == server_pb2.ENGINE_ROLE_AGGREGATED
        assert info.schema_revision == info.minimum_client_revision == 1
        assert "4def7c5" in info.schema_release
        assert info.extra["kv_events_vllm_version"] == "0.33"
    finally:
        await stack.stop()


async def test_model_info_advertises_tokenizer_and_key_spec():
    spec = make_spec("dynamo/xxh3@1.6", 32)
    stack = await start_stack(
        EngineConfig(engine=SimulatedConfig(lora_modules=(LoraModule("a", "/a", 1),))), spec=spec
    )
    try:
        model = stack.models.get(None)
        info = await stack.control.GetModelInfo(model_pb2.GetModelInfoRequest())
        assert info.served_model_name == model.name
        assert info.max_context_length == 8192
        assert info.supports_text_input and info.supports_token_ids_input
        assert info.supports_lora and info.supports_multimodal  # image items over token ids
        assert info.generation.max_num_sequences == 1
        assert info.generation.HasField("guided_decoding")
        assert not info.generation.guided_decoding.supported
        assert info.generation.supports_cache_salt
        ad = info.tokenizer
        assert ad.fingerprint == model.tokenizer.fingerprint
        assert ad.artifact_format == "huggingface"
        assert (ad.key_spec.profile_id, ad.key_spec.profile_version) == ("dynamo/xxh3@1.6", "1.6")
        assert ad.key_spec.spec_fingerprint == spec.fingerprint
        assert ad.key_spec.client_computable is True
        # Loaded models stream their artifacts; no key service is configured here.
        assert ad.artifacts_available and not ad.remote_key_computation
        assert list(ad.operations) == [
            tpb.TOKENIZER_OPERATION_TOKENIZE,
            tpb.TOKENIZER_OPERATION_DETOKENIZE,
            tpb.TOKENIZER_OPERATION_ARTIFACTS,
        ]
        # Availability follows what the server really serves.
        stack.models.replace(
            dataclasses.replace(model, artifacts=None, cache_keys=types.SimpleNamespace(spec=spec))
        )
        ad = (await stack.control.GetModelInfo(model_pb2.GetModelInfoRequest())).tokenizer
        assert not ad.artifacts_available and ad.remote_key_computation
        assert tpb.TOKENIZER_OPERATION_ARTIFACTS not in ad.operations
        assert tpb.TOKENIZER_OPERATION_COMPUTE_CACHE_KEYS in ad.operations
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.control.GetModelInfo(model_pb2.GetModelInfoRequest(model="x"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await stack.stop()


async def test_event_sources_are_routable_and_name_their_key_spec():
    stack = await start_stack(EngineConfig(kv_events_topic="kv@{address}@{model}"), host="0.0.0.0")
    try:
        response = await stack.control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
        zmq_source, grpc_source = response.sources
        spec = stack.local().spec
        for source in response.sources:
            assert source.endpoint_addr.host not in ("", "*", "0.0.0.0", "::")
            assert source.endpoint_addr.port > 0
            assert source.key_spec.spec_fingerprint == spec.fingerprint
            assert source.key_spec.profile_id == spec.profile_id
            assert source.data_parallel_rank == 0
        assert (zmq_source.transport, zmq_source.encoding) == ("zmq", "msgpack")
        assert zmq_source.endpoint_addr.protocol == "tcp"
        assert not is_wildcard(zmq_source.replay_endpoint)
        host = grpc_source.endpoint_addr.host
        assert zmq_source.topic == f"kv@{host}:{stack.port}@{stack.models.names[0]}"
        assert (grpc_source.transport, grpc_source.encoding) == ("grpc", "protobuf")
        assert grpc_source.endpoint_addr.port == stack.port
        assert grpc_source.topic == stack.models.names[0]
        # The advertised ZMQ endpoint is connectable: a replay request gets its end marker.
        ctx = zmq.asyncio.Context(shadow=zmq.Context.instance())
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(zmq_source.replay_endpoint)
        after = stack.local().stream.next_seq  # nothing published from there yet
        await dealer.send_multipart([b"", after.to_bytes(8, "big")])
        assert (await dealer.recv_multipart())[2] == b"\xff" * 8
        dealer.close(linger=0)
        # Filters: a model, and data-parallel ranks.
        none = await stack.control.GetKvEventSources(
            kv_pb2.GetKvEventSourcesRequest(data_parallel_ranks=[3])
        )
        assert list(none.sources) == []
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(model="x"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await stack.stop()


async def test_advertise_host_replaces_the_bind_host():
    stack = await start_stack(EngineConfig(advertise_host="10.1.2.3"), host="0.0.0.0")
    try:
        response = await stack.control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
        assert {s.endpoint_addr.host for s in response.sources} == {"10.1.2.3"}
        assert response.sources[0].replay_endpoint.startswith("tcp://10.1.2.3:")
    finally:
        await stack.stop()


def test_wildcards_are_never_advertised():
    assert endpoint_of("tcp://[::1]:5557", "tcp").host == "::1"
    for bad in ("tcp://*:5557", "tcp://0.0.0.0:1", "0.0.0.0:50051", "ipc:///tmp/x"):
        with pytest.raises(Exception, match="routable"):
            endpoint_of(bad, "tcp")


async def test_load_and_health():
    stack = await start_stack(
        EngineConfig(engine=SimulatedConfig(num_kv_blocks=100), instance_id="w1")
    )
    try:
        load = await stack.control.GetLoad(server_pb2.GetLoadRequest())
        assert (load.instance_id, load.running_requests, load.queued_requests) == ("w1", 0, 0)
        assert (load.used_kv_blocks, load.total_kv_blocks) == (0, 100)
        assert load.timestamp_unix_nanos > 0
        health = await stack.control.Health(lifecycle_pb2.HealthRequest())
        assert health.state == lifecycle_pb2.HEALTH_STATE_READY
        probe = await stack.control.Health(
            lifecycle_pb2.HealthRequest(include_inference_probe=True)
        )
        assert "inference_probe" in [c.name for c in probe.checks]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.control.Health(lifecycle_pb2.HealthRequest(model="x"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        stack.runtime.begin_shutdown()
        health = await stack.control.Health(lifecycle_pb2.HealthRequest())
        assert health.state == lifecycle_pb2.HEALTH_STATE_DRAINING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.generate(prompt="x")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await stack.stop()


async def test_health_is_starting_until_the_engines_are_assembled():
    from engine_stack import default_models

    runtime = EngineRuntime(default_models(), EngineConfig())
    from tokenkeys.server.runtime.discovery_messages import health

    assert health(runtime, False).state == lifecycle_pb2.HEALTH_STATE_STARTING
    with pytest.raises(Exception, match="starting"):
        runtime.parts(runtime.models.names[0])


async def test_two_engines_side_by_side_have_their_own_ports_and_instance_ids():
    one = await start_stack()
    two = await start_stack()
    try:
        infos = [
            await s.control.GetServerInfo(server_pb2.GetServerInfoRequest()) for s in (one, two)
        ]
        assert infos[0].instance_id != infos[1].instance_id
        sources = [
            (await s.control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())).sources
            for s in (one, two)
        ]
        ports = {src.endpoint_addr.port for group in sources for src in group}
        assert len(ports) == 4  # zmq and grpc, per engine
        assert sources[0][0].topic != sources[1][0].topic
        await one.generate(prompt="hello " * 40, stopping=gen.StoppingOptions(max_tokens=1))
        # Each run starts with its AllBlocksCleared; only ``one`` published since.
        assert [s.local().stream.next_seq - s.local().stream.first_seq for s in (one, two)] == [
            2,
            1,
        ]
    finally:
        await one.stop()
        await two.stop()


async def test_several_models_each_have_their_own_stream():
    from tokenkeys.limits import Limits
    from tokenkeys.server.runtime.loading import ModelSource, load_models
    from tokenkeys.tokenizer import TokenizerOptions

    source = ModelSource.default()
    models = load_models(
        [ModelSource("a", source.path), ModelSource("b", source.path)], TokenizerOptions(), Limits()
    )
    stack = await start_stack(models=models)
    try:
        response = await stack.control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
        assert [(s.transport, s.topic.rsplit("@", 1)[-1]) for s in response.sources] == [
            ("zmq", "a"),
            ("grpc", "a"),
            ("zmq", "b"),
            ("grpc", "b"),
        ]
        only_b = await stack.control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(model="b"))
        assert len(only_b.sources) == 2
        await stack.generate(
            prompt="hello " * 40, model="b", stopping=gen.StoppingOptions(max_tokens=1)
        )
        a, b = stack.local("a").stream, stack.local("b").stream
        assert (a.next_seq - a.first_seq, b.next_seq - b.first_seq) == (1, 2)
        call = stack.control.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(model="b"))
        message = await call.read()
        assert message.batch.sequence_number == b.first_seq and message.batch.events
        call.cancel()
    finally:
        await stack.stop()


async def test_get_load_counts_blocks_of_running_requests_not_cached_free_ones():
    stack = await start_stack(EngineConfig(engine=SimulatedConfig(num_kv_blocks=100)))
    try:
        engine = stack.local().engine
        prompt = list(range(100, 180))  # 80 tokens: 5 full blocks of 16
        gen = engine.generate(prompt, GenerationParams(max_tokens=20))
        await gen.__anext__()
        load = await stack.control.GetLoad(server_pb2.GetLoadRequest())
        # 80 + 19 tokens of KV: 7 blocks held (6 allocated, 1 reserved for decode).
        assert (load.running_requests, load.used_kv_blocks) == (1, 7)
        await gen.aclose()
        load = await stack.control.GetLoad(server_pb2.GetLoadRequest())
        assert (load.running_requests, load.used_kv_blocks) == (0, 0)
        assert engine.cache.num_cached_blocks >= 5  # cached, free, not load
    finally:
        await stack.stop()
