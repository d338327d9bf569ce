"""gRPC servicer of OpenEngine ``Control``: discovery, load, health and the KV-event stream.

Every answer is the hosting's (:class:`~tokenkeys.server.runtime.hosting.Hosting`): made here
from the engines whose events this process streams (:mod:`tokenkeys.server.runtime.streamed`),
or forwarded from an OpenEngine engine (:mod:`tokenkeys.server.runtime.forwarded`). The
servicer resolves the model a request names (NotFound lists the served ones) and nothing else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from tokenkeys._gen.openengine.v1 import (
    kv_pb2,
    lifecycle_pb2,
    model_pb2,
    openengine_pb2_grpc,
    server_pb2,
)
from tokenkeys.server.grpc import status as grpc_status
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.serving.models import ModelRegistry


class ControlService(openengine_pb2_grpc.ControlServicer):
    """Control for every served model; see the module doc."""

    def __init__(self, models: ModelRegistry, runtime: EngineRuntime) -> None:
        self._models = models
        self._hosting = runtime.hosting
        self._runtime = runtime

    @grpc_status.unary
    async def GetServerInfo(
        self, request: server_pb2.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.ServerInfo:
        info = await self._hosting.server_info(request)
        # This process's own HTTP frontend, also over a forwarded engine's answer: a router
        # forwards OpenAI requests here, where this server's Preprocessor opens them.
        info.http_frontend = self._runtime.state.http_frontend
        return info

    @grpc_status.unary
    async def GetModelInfo(
        self, request: model_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> model_pb2.ModelInfo:
        return await self._hosting.model_info(self._models.get(request.model), request)

    @grpc_status.unary
    async def GetLoad(
        self, request: server_pb2.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.LoadInfo:
        return await self._hosting.load(request)

    @grpc_status.unary
    async def Health(
        self, request: lifecycle_pb2.HealthRequest, context: grpc.aio.ServicerContext
    ) -> lifecycle_pb2.HealthResponse:
        if request.model:
            self._models.get(request.model)
        return await self._hosting.health(request)

    @grpc_status.unary
    async def GetKvEventSources(
        self, request: kv_pb2.GetKvEventSourcesRequest, context: grpc.aio.ServicerContext
    ) -> kv_pb2.GetKvEventSourcesResponse:
        names = [self._models.get(request.model).name] if request.model else self._models.names
        return await self._hosting.event_sources(names, request)

    @grpc_status.streaming
    async def SubscribeKvEvents(
        self, request: kv_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[kv_pb2.SubscribeKvEventsResponse]:
        model = self._models.get(request.model)
        async for message in self._hosting.subscribe(model, request):
            yield message
