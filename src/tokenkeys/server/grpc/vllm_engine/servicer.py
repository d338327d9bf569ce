"""gRPC servicer of smg's ``vllm.grpc.engine.VllmEngine`` over one served model's engine.

smg (SGLang's gateway, ``smg launch --worker-urls grpc://HOST:PORT``) routes to a worker through
this service: it loads the tokenizer from ``GetTokenizer``, tokenizes itself, sends token ids to
``Generate``, polls ``GetLoads``/``HealthCheck`` and feeds ``SubscribeKvEvents`` into its
cache-aware index. The service names no model, so the face serves a server's one model (the
assembly refuses it on a server of several). It calls only the model's
:class:`~tokenkeys.engine.protocol.Engine` and the served model, the same for every engine
kind; the request and answer shapes are in the sibling modules. ``FlushCache`` resets the
engine's prefix cache where its kind can (``flush``). ``Embed`` and the profiler calls are
UNIMPLEMENTED with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from tokenkeys._gen.openengine.v1 import server_pb2
from tokenkeys.engine.protocol import GenerateOutput, PrefixCacheReset
from tokenkeys.errors import InvalidArgument, Unavailable, Unsupported
from tokenkeys.server.grpc import status as grpc_status
from tokenkeys.server.grpc.vllm_engine import flush, generate, info
from tokenkeys.server.grpc.vllm_engine.bundle import TokenizerBundle, build_bundle
from tokenkeys.server.grpc.vllm_engine.load_estimate import LoadEstimate
from tokenkeys.server.grpc.vllm_engine.stubs import (
    common_pb2,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)
from tokenkeys.server.grpc.vllm_engine.subscription import smg_batches
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.serving.models import ModelRegistry, ServedModel

pb = vllm_engine_pb2


class _Aborted(Exception):
    """Generate saw its request aborted between two outputs of the engine."""


@dataclass
class _Generating:
    """A running Generate: its task, and whether it is awaiting the engine's next output."""

    task: asyncio.Task
    at_engine: bool = False


class VllmEngineService(vllm_engine_pb2_grpc.VllmEngineServicer):
    """``VllmEngine`` for the one model of ``models``; see the module doc."""

    def __init__(self, models: ModelRegistry, runtime: EngineRuntime) -> None:
        self._models = models
        self._name = models.get(None).name
        self._runtime = runtime
        self._estimate = LoadEstimate()
        self._bundle: TokenizerBundle | None = None
        # request id -> the Generate serving it, for Abort
        self._running: dict[str, _Generating] = {}
        self._aborted: set[str] = set()

    def _model(self) -> ServedModel:
        return self._models.get(self._name)

    async def _block_size(self) -> int:
        """The engine's KV block size, as the hosting's GetServerInfo states it (0: unknown)."""
        served = await self._runtime.hosting.server_info(server_pb2.GetServerInfoRequest())
        return served.capacity.kv_block_size

    @grpc_status.streaming
    async def Generate(
        self, request: vllm_engine_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[vllm_engine_pb2.GenerateResponse]:
        model = self._model()
        engine = self._runtime.engine_of(model.name)
        inputs = generate.read_request(request, model)
        rid = inputs.request_id
        if rid in self._running:
            raise InvalidArgument(f"request_id {rid!r} is already running", field="request_id")
        task = asyncio.current_task()
        assert task is not None
        running = self._running[rid] = _Generating(task)
        prompt_tokens = len(inputs.token_ids)
        tokens: list[int] = []
        estimate = self._estimate
        estimate.submitted(rid, prompt_tokens)
        try:
            outputs = engine.generate(inputs.token_ids, inputs.params, request_id=rid)
            async with contextlib.aclosing(outputs) as stream:
                while True:
                    if rid in self._aborted:
                        raise _Aborted  # while grpc was writing the last chunk (see Abort)
                    running.at_engine = True
                    try:
                        output = await anext(stream)
                    except StopAsyncIteration:
                        break
                    finally:
                        running.at_engine = False
                    tokens.extend(output.token_ids)
                    estimate.generated(rid, len(output.token_ids))
                    if inputs.stream:
                        yield generate.chunk(output, prompt_tokens)
                    if not output.finished:
                        continue
                    usage = output.usage
                    cached = usage.cached_prompt_tokens if usage is not None else 0
                    estimate.counted(prompt_tokens, cached)
                    ids = list(output.token_ids) if inputs.stream else tokens
                    reason = output.finish_reason or "stop"
                    matched = inputs.matched_token(tokens, reason)
                    yield generate.complete(ids, reason, prompt_tokens, cached, matched)
                    return
            raise Unavailable(
                f"the engine of {model.name!r} ended without finishing", field="model"
            )
        except (asyncio.CancelledError, _Aborted):
            if rid not in self._aborted:
                raise
            # Abort ends the request as vLLM ends an aborted one: finish reason "abort", after
            # (streamed) one last chunk. vLLM's carries the tokens made since the client's last
            # read, none when Abort lands between two steps; the face's carries none (a step
            # still in flight from the engine is cancelled with the request).
            if inputs.stream:
                yield generate.chunk(GenerateOutput(rid, ()), prompt_tokens)
            yield generate.complete([] if inputs.stream else tokens, "abort", prompt_tokens, 0)
        finally:
            estimate.finished(rid)
            self._running.pop(rid, None)
            self._aborted.discard(rid)

    @grpc_status.unary
    async def Abort(
        self, request: vllm_engine_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.AbortResponse:
        for rid in request.request_ids:  # ids not running (any more) are ignored, as vLLM does
            running = self._running.get(rid)
            if running is not None and rid not in self._aborted:
                self._aborted.add(rid)
                # Cancelled only while it awaits the engine: a cancel that lands in grpc's own
                # write of a streamed chunk would end the call with no status at all (the
                # client waits for its deadline). Otherwise Generate sees the abort when grpc
                # resumes it after the write, before it awaits the engine again.
                if running.at_engine:
                    running.task.cancel()
        return pb.AbortResponse()

    @grpc_status.unary
    async def HealthCheck(
        self, request: vllm_engine_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.HealthCheckResponse:
        runtime = self._runtime
        if runtime.draining or not runtime.ready:
            state = "stopping" if runtime.draining else "starting"
            return pb.HealthCheckResponse(healthy=False, message=f"the engine is {state}")
        try:
            await runtime.ensure_up()
        except Unavailable as error:
            return pb.HealthCheckResponse(healthy=False, message=error.message)
        return pb.HealthCheckResponse(healthy=True, message="Health")

    @grpc_status.unary
    async def GetModelInfo(
        self, request: vllm_engine_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.GetModelInfoResponse:
        model = self._model()
        engine = model.engine
        return info.model_info(model, engine.max_model_len if engine is not None else None)

    @grpc_status.unary
    async def GetServerInfo(
        self, request: vllm_engine_pb2.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.GetServerInfoResponse:
        await self._runtime.ensure_up()
        return info.server_info(await self._block_size())

    @grpc_status.unary
    async def GetLoads(
        self, request: vllm_engine_pb2.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> vllm_engine_pb2.GetLoadsResponse:
        if request.HasField("dp_rank") and request.dp_rank != 0:
            raise InvalidArgument(
                f"dp_rank {request.dp_rank} is not served here; this engine has rank 0 only",
                field="dp_rank",
            )
        engine = self._runtime.engine_of(self._name)
        return info.loads(await engine.load(), await self._block_size(), self._estimate)

    @grpc_status.streaming
    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        if self._bundle is None:  # the served tokenizer never changes under a running server
            self._bundle = await asyncio.to_thread(build_bundle, self._model().tokenizer.folder)
        for chunk in self._bundle.chunks():
            yield chunk

    @grpc_status.streaming
    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        model = self._model()
        self._runtime.parts(model.name)  # Unavailable while starting or stopping
        batches = smg_batches(self._runtime.hosting, model, request.start_sequence_number)
        # smg counts the subscription as answered once the headers arrive (within 2 s), not at
        # the first batch, which may be long in coming: send them now, as vLLM's relay does.
        await context.send_initial_metadata(())
        async for batch in batches:
            yield batch

    @grpc_status.unary
    async def Embed(self, request, context):  # noqa: ANN001, ANN201 - generated signature
        raise Unsupported("embeddings are not served by tokenkeys engines", field="Embed")

    @grpc_status.unary
    async def FlushCache(self, request, context):  # noqa: ANN001, ANN201 - generated signature
        engine = self._model().engine
        if not isinstance(engine, PrefixCacheReset):
            raise Unsupported(
                f"FlushCache is not offered by this engine kind ({type(engine).__name__}): it "
                "has no prefix-cache reset",
                field="FlushCache",
            )
        return await flush.flush_cache(engine, request.timeout_s, context.time_remaining())

    @grpc_status.unary
    async def StartProfile(self, request, context):  # noqa: ANN001, ANN201 - generated signature
        raise Unsupported("tokenkeys engines have no profiler", field="StartProfile")

    @grpc_status.unary
    async def StopProfile(self, request, context):  # noqa: ANN001, ANN201 - generated signature
        raise Unsupported("tokenkeys engines have no profiler", field="StopProfile")
