"""gRPC servicer of OpenEngine ``Control``: discovery, load, health and the KV-event stream.

With simulated engines every answer is local. With ``--engine HOST:PORT`` the calls that
describe the engine (GetServerInfo, GetLoad, GetKvEventSources, SubscribeKvEvents) are forwarded
to it unchanged, Health reports the engine's state, and GetModelInfo is the engine's with this
frontend's tokenizer advertisement (the frontend tokenizes; the engine's key spec stays, since
its events follow it).

``SubscribeKvEvents`` streams one model's batches (tokenkeys' ``model`` field 100, empty for the
default model) as protobuf ``KvEventBatch``es whose ``sequence_number`` is the ZMQ sequence
number of the same batch. ``start_sequence_number`` replays what is still buffered from there
on, then follows live. The stream ends with one ``EngineError``: OVERLOADED (retryable) when the
subscriber fell too far behind, DRAINING (retryable) when the server stops.
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
from tokenkeys.engine.proto_errors import draining, engine_error
from tokenkeys.engine.remote import RemoteEngine
from tokenkeys.errors import InvalidArgument, LimitExceeded, Unsupported, from_grpc
from tokenkeys.server.grpc import status as grpc_status
from tokenkeys.server.grpc.discovery_messages import (
    event_sources,
    health,
    load_info,
    model_info,
    server_info,
    tokenizer_advertisement,
)
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.serving.models import ModelRegistry


def _check_ranks(ranks: list[int]) -> bool:
    """Whether the requested data-parallel ranks include this engine's only rank, 0."""
    return not ranks or 0 in ranks


class ControlService(openengine_pb2_grpc.ControlServicer):
    """Control for every served model; see the module doc."""

    def __init__(self, models: ModelRegistry, runtime: EngineRuntime) -> None:
        self._models = models
        self._runtime = runtime

    def _remote(self, model: str | None = None) -> RemoteEngine | None:
        if not self._runtime.remote:
            return None
        name = self._models.get(model).name
        return self._runtime.parts(name).remote

    @grpc_status.unary
    async def GetServerInfo(
        self, request: server_pb2.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.ServerInfo:
        remote = self._remote()
        if remote is not None:
            return await _forward(remote.control.GetServerInfo(request))
        await self._runtime.ensure_up()
        return server_info(self._runtime)

    @grpc_status.unary
    async def GetModelInfo(
        self, request: model_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> model_pb2.ModelInfo:
        model = self._models.get(request.model)
        remote = self._remote(model.name)
        if remote is None:
            return model_info(model, self._runtime)
        info = await _forward(remote.control.GetModelInfo(request))
        ad = tokenizer_advertisement(model, self._runtime)
        if info.tokenizer.HasField("key_spec"):
            ad.key_spec.CopyFrom(info.tokenizer.key_spec)
        info.tokenizer.CopyFrom(ad)
        return info

    @grpc_status.unary
    async def GetLoad(
        self, request: server_pb2.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.LoadInfo:
        remote = self._remote()
        if remote is not None:
            return await _forward(remote.control.GetLoad(request))
        return await load_info(self._runtime)

    @grpc_status.unary
    async def Health(
        self, request: lifecycle_pb2.HealthRequest, context: grpc.aio.ServicerContext
    ) -> lifecycle_pb2.HealthResponse:
        if request.model:
            self._models.get(request.model)
        runtime = self._runtime
        if not runtime.remote or not runtime.ready or runtime.draining:
            return health(runtime, request.include_inference_probe)
        remote = self._remote(request.model or None)
        assert remote is not None
        try:
            return await remote.control.Health(request)
        except grpc.RpcError as error:
            return lifecycle_pb2.HealthResponse(
                state=lifecycle_pb2.HEALTH_STATE_NOT_READY,
                checks=[
                    lifecycle_pb2.HealthCheck(name="grpc", state=lifecycle_pb2.HEALTH_STATE_READY),
                    lifecycle_pb2.HealthCheck(
                        name="engine",
                        state=lifecycle_pb2.HEALTH_STATE_NOT_READY,
                        message=f"remote engine {remote.target}: {from_grpc(error).message}",
                    ),
                ],
            )

    @grpc_status.unary
    async def GetKvEventSources(
        self, request: kv_pb2.GetKvEventSourcesRequest, context: grpc.aio.ServicerContext
    ) -> kv_pb2.GetKvEventSourcesResponse:
        names = [self._models.get(request.model).name] if request.model else self._models.names
        remote = self._remote(request.model or None)
        if remote is not None:
            return await _forward(remote.control.GetKvEventSources(request))
        response = kv_pb2.GetKvEventSourcesResponse()
        if _check_ranks(list(request.data_parallel_ranks)):
            for name in names:
                response.sources.extend(event_sources(self._runtime.local(name), self._runtime))
        return response

    @grpc_status.streaming
    async def SubscribeKvEvents(
        self, request: kv_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[kv_pb2.SubscribeKvEventsResponse]:
        model = self._models.get(request.model)
        remote = self._remote(model.name)
        if remote is not None:
            try:
                async for message in remote.control.SubscribeKvEvents(request):
                    yield message
            except grpc.RpcError as error:
                raise from_grpc(error) from None
            return
        if not _check_ranks(list(request.data_parallel_ranks)):
            raise InvalidArgument(
                f"data_parallel_ranks {list(request.data_parallel_ranks)} are not served here; "
                "this engine has rank 0 only",
                field="data_parallel_ranks",
            )
        if request.include_snapshot:
            raise Unsupported(
                "include_snapshot is not supported; replay from start_sequence_number instead "
                "(the buffer keeps the last --kv-events-buffer-steps batches)",
                field="include_snapshot",
            )
        parts = self._runtime.local(model.name)
        assert parts.local is not None and parts.protobuf is not None
        codec = parts.protobuf
        try:
            async for seq, batch in parts.local.stream.subscribe(request.start_sequence_number):
                yield kv_pb2.SubscribeKvEventsResponse(batch=codec.encode(seq, batch))
        except LimitExceeded as error:
            yield kv_pb2.SubscribeKvEventsResponse(error=engine_error(error))
            return
        yield kv_pb2.SubscribeKvEventsResponse(
            error=draining(
                "the server is stopping; resubscribe (to another instance) with "
                "start_sequence_number set to the next sequence number you need"
            )
        )


async def _forward(call):  # noqa: ANN001, ANN202 - any unary call of a Control stub
    """Await a forwarded call, translating its failure into the error tree."""
    try:
        return await call
    except grpc.RpcError as error:
        raise from_grpc(error) from None
