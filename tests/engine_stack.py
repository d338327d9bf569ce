"""Test helper: the engine side of ``tokenkeys serve`` on a real loopback gRPC port, in the test's
own event loop (Control, Inference and OpenEngineTokenizer, real ZMQ sockets), plus small
clients for its KV-event streams.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import grpc

from tokenkeys._gen.openengine.v1 import (
    generation_pb2,
    kv_pb2,
    openengine_pb2_grpc,
)
from tokenkeys.engine.config import EngineConfig
from tokenkeys.engine.simulated.local import LocalEngine
from tokenkeys.events.model import EventBatch
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_subscriber import ZmqEventSubscriber
from tokenkeys.keys import CacheKeySpec
from tokenkeys.limits import Limits
from tokenkeys.server.assembly import EngineServer, ServeConfig
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import ModelRegistry, ServedModel
from tokenkeys.tokenizer import TokenizerOptions


def default_models() -> ModelRegistry:
    """The embedded tokenizer as the one served model."""
    return load_models([ModelSource.default()], TokenizerOptions(), Limits())


@dataclasses.dataclass
class EngineStack:
    """A started server: its port, runtime, stubs; ``await stack.stop()`` at the end."""

    models: ModelRegistry
    serving: EngineServer
    channel: grpc.aio.Channel

    @property
    def runtime(self) -> EngineRuntime:
        assert self.serving.runtime is not None
        return self.serving.runtime

    @property
    def server(self) -> grpc.aio.Server:
        assert self.serving.grpc is not None
        return self.serving.grpc

    @property
    def port(self) -> int:
        return self.serving.grpc_port

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def inference(self) -> openengine_pb2_grpc.InferenceStub:
        return openengine_pb2_grpc.InferenceStub(self.channel)

    @property
    def control(self) -> openengine_pb2_grpc.ControlStub:
        return openengine_pb2_grpc.ControlStub(self.channel)

    def local(self, model: str | None = None) -> LocalEngine:
        engine = self.models.get(model).engine
        assert isinstance(engine, LocalEngine)
        return engine

    async def generate(self, **request: object) -> list[generation_pb2.GenerateResponse]:
        """One Generate call; returns every message."""
        call = self.inference.Generate(generation_pb2.GenerateRequest(**request))
        return [m async for m in call]

    async def generate_call(self, **request: object):  # noqa: ANN201
        """One Generate call; returns (messages, trailing metadata as a dict)."""
        call = self.inference.Generate(generation_pb2.GenerateRequest(**request))
        messages = [m async for m in call]
        return messages, dict(await call.trailing_metadata())

    async def stop(self) -> None:
        self.serving.begin_drain()
        await self.channel.close()
        await self.serving.stop()


async def start_stack(
    config: EngineConfig | None = None,
    *,
    models: ModelRegistry | None = None,
    spec: CacheKeySpec | Callable[[ServedModel], CacheKeySpec] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: Limits | None = None,
    vllm_engine_face: bool = False,
    http_port: int | None = None,
) -> EngineStack:
    """Start the engine services for ``models`` (default: the embedded tokenizer).

    ``port`` 0 picks a free gRPC port; a fixed one lets a test restart an engine in place.
    ``http_port`` (0: a free one) adds the OpenAI HTTP frontend, advertised in GetServerInfo.
    """
    models = models or default_models()
    spec_of = spec if callable(spec) or spec is None else (lambda _model: spec)
    serve = ServeConfig(
        host=host,
        grpc_port=port,
        limits=limits or Limits(),
        engine=config or EngineConfig(),
        spec_of=spec_of,
        vllm_engine_face=vllm_engine_face,
        http_port=http_port,
    )
    serving = await EngineServer(models, serve).start()
    # A subchannel of its own: gRPC shares one per target and options across a process's
    # channels, and a stack restarted on its port (RouterCluster.restart_engine) could take
    # over the previous stack's, left in reconnect backoff while the port was closed: its first
    # call failed "Connection refused" with the new server listening (seen once in a whole run).
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{serving.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )
    return EngineStack(models, serving, channel)


class GrpcEvents:
    """A SubscribeKvEvents stream read message by message, from ``start`` (default: the first
    batch after the run's opening ``AllBlocksCleared``)."""

    def __init__(self, stack: EngineStack, start: int | None = None, model: str = "") -> None:
        if start is None:
            start = stack.local(model or None).stream.first_seq + 1
        self.call = stack.control.SubscribeKvEvents(
            kv_pb2.SubscribeKvEventsRequest(start_sequence_number=start, model=model)
        )
        self._iter = self.call.__aiter__()

    async def next(self, timeout: float = 5.0) -> kv_pb2.SubscribeKvEventsResponse:
        return await asyncio.wait_for(self._iter.__anext__(), timeout)

    async def batches(self, count: int, timeout: float = 5.0) -> list[kv_pb2.KvEventBatch]:
        out = []
        for _ in range(count):
            message = await self.next(timeout)
            assert message.WhichOneof("event") == "batch", message
            out.append(message.batch)
        return out

    def cancel(self) -> None:
        self.call.cancel()


async def zmq_batches_until(
    stack: EngineStack, last_seq: int, model: str | None = None, timeout: float = 5.0
) -> list[tuple[int, EventBatch]]:
    """Every batch of the run up to last_seq over ZMQ: a SUB from seq 0, repaired by replay (no
    slow joiner)."""
    parts = stack.runtime.parts(stack.models.get(model).name)
    info = parts.zmq_source()
    assert info is not None
    codec = VllmMsgpackCodec()
    sub = ZmqEventSubscriber(
        info.endpoint, replay_endpoint=info.replay_endpoint, topic=info.topic, start_seq=0
    )
    await sub.start()
    stream = parts.engine.stream
    out: list[tuple[int, EventBatch]] = []
    seen = -1
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        # The subscriber catches up when it connects; empty probe batches, numbered like any
        # batch, are a safety net for a catch-up replay that failed (a gap shows at a later one).
        while seen < last_seq:
            assert loop.time() < deadline, f"ZMQ batches up to {last_seq} not received"
            try:
                delivery = await asyncio.wait_for(sub.recv(), 0.2)
            except asyncio.TimeoutError:
                stream.emit(EventBatch(0.0, ()))
                continue
            seen = delivery.seq
            if delivery.seq <= last_seq:
                out.append((delivery.seq, codec.decode(delivery.payload)))
    finally:
        await sub.close()
    return out


class ServeProcess:
    """``tokenkeys serve ARGS`` in a subprocess on this checkout; ``port`` once it listens.

    gRPC and HTTP ports default to free ones (0): two servers never race for the fixed 8000.

    Stopped with SIGINT (the server's clean shutdown path) and waited for.
    """

    def __init__(self, *args: str) -> None:
        import os
        import subprocess
        import sys

        from support import REPO

        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tokenkeys.cli",
                "serve",
                "--grpc-port",
                "0",
                "--http-port",
                "0",
                *args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.port = 0

    def __enter__(self) -> ServeProcess:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            from support import log_message

            self.lines.append(log_message(line))
            if "gRPC listening on " in line:
                self.port = int(line.rsplit(":", 1)[1])
                return self
        _, err = self.proc.communicate(timeout=10)
        raise AssertionError(f"tokenkeys serve exited: {self.lines} {err}")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> tuple[int, str, str]:
        """SIGINT, then (exit code, rest of stdout, stderr)."""
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, err = self.proc.communicate(timeout=20)
        except Exception:
            self.proc.kill()
            out, err = self.proc.communicate()
        return self.proc.returncode, out, err

    def __exit__(self, *exc: object) -> None:
        self.stop()
