"""Every configurable limit over real gRPC servers: a request at the limit passes, one past it
is refused with the documented status and a message naming the limit (HTTP:
test_frontend_limits)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from engine_stack import start_stack

from tokenkeys._gen.openengine.v1 import generation_pb2, lifecycle_pb2
from tokenkeys.artifacts import ArtifactLimits, PullSettings, fetch
from tokenkeys.client import TokenizerClient
from tokenkeys.engine.config import EngineConfig, SimulatedConfig
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.errors import ConfigError, LimitExceeded
from tokenkeys.limits import Limits
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.template.render import RenderLimits
from tokenkeys.tokenizer import TokenizerOptions

from support import run_cli

# The embedded tokenizer splits digits one by one and adds no special token: n digits, n ids.
DIGITS = "1234567890"


def _models(limits: Limits):
    return load_models([ModelSource.default()], TokenizerOptions(), limits)


def _digits(n: int) -> str:
    return (DIGITS * (n // 10 + 1))[:n]


@pytest.fixture
def tokenizer(grpc_server):
    limits = Limits(max_texts_per_request=3, max_tokens_per_text=10, max_tokens_per_request=25)
    server = grpc_server(_models(limits), limits)
    with TokenizerClient(server.target) as client:
        yield client


def test_digits_are_one_token_each(tokenizer) -> None:
    assert tokenizer.tokenize([_digits(7)]).results[0].count == 7


def test_texts_per_request(tokenizer) -> None:
    assert len(tokenizer.tokenize(["a", "b", "c"]).results) == 3
    with pytest.raises(LimitExceeded, match="max_texts_per_request") as info:
        tokenizer.tokenize(["a", "b", "c", "d"])
    assert info.value.details["grpc_code"] == "RESOURCE_EXHAUSTED"


def test_tokens_per_text(tokenizer) -> None:
    assert tokenizer.tokenize([_digits(10)]).results[0].count == 10
    with pytest.raises(LimitExceeded, match=r"texts\[1\] amounts to 11.*max_tokens_per_text"):
        tokenizer.tokenize(["1", _digits(11)])
    assert len(tokenizer.detokenize([[17] * 10]).texts) == 1
    with pytest.raises(LimitExceeded, match="max_tokens_per_text"):
        tokenizer.detokenize([[17] * 11])


def test_tokens_per_request(tokenizer) -> None:
    assert tokenizer.tokenize([_digits(10), _digits(10), _digits(5)]).total_tokens == 25
    with pytest.raises(LimitExceeded, match="26 tokens.*max_tokens_per_request"):
        tokenizer.tokenize([_digits(10), _digits(10), _digits(6)])


def test_grpc_message_size(grpc_server) -> None:
    limits = Limits(max_request_bytes=2048)
    server = grpc_server(_models(limits), limits)
    with TokenizerClient(server.target) as client:
        # A TokenizeRequest of one text of n characters takes n + 3 bytes (tag, 2-byte length).
        assert client.tokenize(["a" * 2045]).results[0].count > 0
        with pytest.raises(LimitExceeded) as info:
            client.tokenize(["a" * 2046])
        assert info.value.details["grpc_code"] == "RESOURCE_EXHAUSTED"


def test_artifact_size(grpc_server, tmp_path: Path) -> None:
    models = _models(Limits())
    server = grpc_server(models)
    sizes = {e.path: e.size for e in models.get(None).tokenizer.folder.entries}
    total, largest = sum(sizes.values()), max(sizes.values())

    def pull(name: str, limits: ArtifactLimits):
        return fetch(server.target, cache=tmp_path / name, settings=PullSettings(limits=limits))

    assert pull("at", ArtifactLimits(max_file_bytes=largest, max_total_bytes=total)).transferred
    with pytest.raises(LimitExceeded, match="max_total_bytes"):
        pull("total", ArtifactLimits(max_total_bytes=total - 1))
    with pytest.raises(LimitExceeded, match="max_file_bytes"):
        pull("file", ArtifactLimits(max_file_bytes=largest - 1))
    assert not any((tmp_path / "total").glob("*/tokenizer.json"))


def test_limits_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="--max-texts-per-request"):
        Limits(max_texts_per_request=0)
    assert Limits(max_streams_per_client=0).max_streams_per_client == 0  # 0: no limit


# ----------------------------------------------------------------------------- streams


_SLOW = LatencyModel(decode_s_per_token=0.05, sleep=True)


def _request(prompt: str, max_tokens: int) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        prompt=prompt,
        stopping=generation_pb2.StoppingOptions(max_tokens=max_tokens, ignore_eos=True),
    )


async def test_grpc_streams_per_client() -> None:
    stack = await start_stack(
        EngineConfig(engine=SimulatedConfig(latency=_SLOW), kv_events=False),
        limits=Limits(max_streams_per_client=2),
    )
    try:
        calls = []
        for _ in range(2):
            call = stack.inference.Generate(_request("hello", 200))
            await call.read()  # admitted and streaming
            calls.append(call)
        refused = stack.inference.Generate(_request("x", 1))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await refused.read()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_streams_per_client" in info.value.details()
        # Unary calls do not count; a stream ending frees its slot.
        health = await stack.control.Health(lifecycle_pb2.HealthRequest())
        assert health.state == lifecycle_pb2.HEALTH_STATE_READY
        calls[0].cancel()
        for _ in range(100):
            again = stack.inference.Generate(_request("x", 1))
            try:
                messages = [m async for m in again]
                break
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                await asyncio.sleep(0.02)
        assert messages[-1].WhichOneof("event") == "finished"
        calls[1].cancel()
    finally:
        await stack.stop()


def test_render_limits_are_serve_options() -> None:
    result = run_cli(
        "serve",
        "--grpc-port",
        "0",
        "--http-port",
        "0",
        "--chat-template-max-output-chars",
        "0",
        check=False,
    )
    assert result.returncode == 2 and "max_output_chars must be positive" in result.stderr


def test_render_limits_stay_out_of_the_fingerprint() -> None:
    limited = ChatOptions(limits=RenderLimits(max_output_chars=1000, max_render_seconds=1))
    models = load_models([ModelSource.default()], TokenizerOptions(), Limits(), limited)
    assert (
        models.get(None).tokenizer.fingerprint == _models(Limits()).get(None).tokenizer.fingerprint
    )
