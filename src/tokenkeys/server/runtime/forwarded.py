"""Hosting engines that are OpenEngine servers of their own: ``serve --engine HOST:PORT``.

The frontend tokenizes (its Preprocessor, its tokenizer advertisement); everything that
describes the engine is the engine's: GetServerInfo, GetLoad, GetKvEventSources and
SubscribeKvEvents are forwarded unchanged, Health reports the engine's state, and GetModelInfo
is the engine's with this frontend's tokenizer advertisement (the engine's key spec stays,
since its events follow it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from tokenkeys._gen.openengine.v1 import kv_pb2, lifecycle_pb2, model_pb2, server_pb2
from tokenkeys.engine.hosting import EngineInputs, ForwardedEngine
from tokenkeys.errors import from_grpc
from tokenkeys.events.model import EventSourceInfo
from tokenkeys.server.runtime import discovery_messages as messages
from tokenkeys.server.runtime.state import RuntimeState
from tokenkeys.serving.models import ServedModel


@dataclass
class ForwardedParts:
    """The running parts of one model: its engine only (its events are the engine's)."""

    engine: ForwardedEngine

    def zmq_source(self) -> EventSourceInfo | None:
        """None: no events are published here."""
        return None


class ForwardedHosting:
    """The engines of a process that forwards to OpenEngine engines; see the module doc."""

    def __init__(self, runtime: RuntimeState) -> None:
        self.runtime = runtime
        self.models: dict[str, ForwardedParts] = {}

    async def start(self, bind_host: str) -> None:
        """Build and start every model's engine."""
        runtime = self.runtime
        for model in runtime.models:
            spec = runtime.spec_of(model)
            inputs = EngineInputs(model.name, model.tokenizer, spec, runtime.config)
            # A kind hosted "forwarded" builds a ForwardedEngine (engine.registry.EngineKind).
            engine: ForwardedEngine = runtime.kind.build(inputs)  # type: ignore[assignment]
            self.models[model.name] = ForwardedParts(engine)
            await engine.start()

    def parts(self, model: str) -> ForwardedParts:
        """The parts of a served model (KeyError when it has none)."""
        return self.models[model]

    def describe(self) -> list[str]:
        """One line per model: where generation is forwarded."""
        return [f"engine {name}: {p.engine.describe()}" for name, p in self.models.items()]

    def end_streams(self) -> None:
        """Nothing: forwarded subscriptions end when the engine's do, or with the server."""

    async def close(self) -> None:
        """Close every engine's channel (idempotent)."""
        models, self.models = self.models, {}
        for parts in models.values():
            await parts.engine.close()

    def _ready(self, model: str | None = None) -> ForwardedParts:
        return self.runtime.serving(self.parts, self.runtime.models.get(model).name)

    def _control(self, model: str | None = None):  # noqa: ANN202 - a ControlStub
        return self._ready(model).engine.control

    async def server_info(self, request: server_pb2.GetServerInfoRequest) -> server_pb2.ServerInfo:
        """The engine's own answer."""
        return await _forward(self._control().GetServerInfo(request))

    async def model_info(
        self, model: ServedModel, request: model_pb2.GetModelInfoRequest
    ) -> model_pb2.ModelInfo:
        """The engine's answer, with this frontend's tokenizer advertisement."""
        info = await _forward(self._control(model.name).GetModelInfo(request))
        ad = messages.tokenizer_advertisement(model)
        if info.tokenizer.HasField("key_spec"):
            ad.key_spec.CopyFrom(info.tokenizer.key_spec)
        info.tokenizer.CopyFrom(ad)
        return info

    async def load(self, request: server_pb2.GetLoadRequest) -> server_pb2.LoadInfo:
        """The engine's own answer."""
        return await _forward(self._control().GetLoad(request))

    async def health(self, request: lifecycle_pb2.HealthRequest) -> lifecycle_pb2.HealthResponse:
        """This frontend's state while starting or stopping, else the engine's."""
        runtime = self.runtime
        if not runtime.ready or runtime.draining:
            return messages.health(runtime, request.include_inference_probe)
        engine = self._ready(request.model or None).engine
        try:
            return await engine.control.Health(request)
        except grpc.RpcError as error:
            return lifecycle_pb2.HealthResponse(
                state=lifecycle_pb2.HEALTH_STATE_NOT_READY,
                checks=[
                    lifecycle_pb2.HealthCheck(name="grpc", state=lifecycle_pb2.HEALTH_STATE_READY),
                    lifecycle_pb2.HealthCheck(
                        name="engine",
                        state=lifecycle_pb2.HEALTH_STATE_NOT_READY,
                        message=f"remote engine {engine.target}: {from_grpc(error).message}",
                    ),
                ],
            )

    async def event_sources(
        self, names: list[str], request: kv_pb2.GetKvEventSourcesRequest
    ) -> kv_pb2.GetKvEventSourcesResponse:
        """The engine's own answer."""
        model = request.model or None
        return await _forward(self._control(model).GetKvEventSources(request))

    async def subscribe(
        self, model: ServedModel, request: kv_pb2.SubscribeKvEventsRequest
    ) -> AsyncIterator[kv_pb2.SubscribeKvEventsResponse]:
        """The engine's own stream, message for message."""
        try:
            async for message in self._control(model.name).SubscribeKvEvents(request):
                yield message
        except grpc.RpcError as error:
            raise from_grpc(error) from None


async def _forward(call):  # noqa: ANN001, ANN202 - any unary call of a Control stub
    """Await a forwarded call, translating its failure into the error tree."""
    try:
        return await call
    except grpc.RpcError as error:
        raise from_grpc(error) from None
