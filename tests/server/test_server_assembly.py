"""The one builder of ``tokenkeys serve`` (:class:`EngineServer`): order, all-or-nothing, drain."""

from __future__ import annotations

import socket

import grpc
import httpx
import pytest
from engine_stack import default_models

from tokenkeys._gen.openengine.v1 import kv_pb2, openengine_pb2_grpc
from tokenkeys.engine.config import EngineConfig, SimulatedConfig
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.engine.simulated.local import LocalEngine
from tokenkeys.errors import ConfigError
from tokenkeys.keys import make_spec
from tokenkeys.server.assembly import EngineServer, ServeConfig

SPEC = make_spec("vllm/sha256_cbor@0.31", 16)


def _config(**overrides: object) -> ServeConfig:
    base: dict[str, object] = {
        "grpc_port": 0,
        "http_port": 0,
        "engine": EngineConfig(engine=SimulatedConfig(latency=LatencyModel(sleep=False))),
        "cache_keys": SPEC,
    }
    base.update(overrides)
    return ServeConfig(**base)  # type: ignore[arg-type]


async def test_start_runs_the_steps_in_order() -> None:
    models = default_models()
    server = await EngineServer(models, _config()).start()
    try:
        model = models.get(None)
        # Cache keys first: the engine keys its blocks with the served spec.
        assert model.cache_keys is not None and model.cache_keys.spec == SPEC
        assert isinstance(model.engine, LocalEngine) and model.engine.spec == SPEC
        # The engines started after gRPC listened: their events name the gRPC address.
        assert server.runtime is not None
        assert server.runtime.grpc_address == f"127.0.0.1:{server.grpc_port}"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            control = openengine_pb2_grpc.ControlStub(channel)
            sources = await control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
        assert any(str(server.grpc_port) in s.topic for s in sources.sources)
        # HTTP last: its generation routes reach the attached engine.
        url = f"http://127.0.0.1:{server.http_port}"
        async with httpx.AsyncClient(base_url=url) as http:
            answer = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 2
    finally:
        await server.stop()


async def test_a_failed_step_leaves_nothing_open() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        server = EngineServer(default_models(), _config(http_port=busy))
        with pytest.raises(ConfigError, match="cannot bind HTTP"):
            await server.start()
    # The gRPC server and the engines started before the HTTP step are stopped again.
    assert server.grpc is None and server.http is None
    assert server.runtime is not None and not server.runtime.ready
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", server.grpc_port))  # the gRPC port was released


async def test_drain_refuses_new_calls_on_both_faces() -> None:
    server = await EngineServer(default_models(), _config()).start()
    try:
        assert await server.drain(1.0) == 0
        url = f"http://127.0.0.1:{server.http_port}"
        async with httpx.AsyncClient(base_url=url) as http:
            refused = await http.post("/v1/completions", json={"prompt": "hi"})
        assert refused.status_code == 503
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            control = openengine_pb2_grpc.ControlStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop()
