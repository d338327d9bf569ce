"""gRPC servicer of OpenEngine ``Inference.Generate``: a thin translation onto the model's engine.

Text is tokenized by the model's Preprocessor (the one path); the engine is the model's
:class:`~tokenkeys.engine.protocol.Engine` (the simulated engine, or a remote OpenEngine
engine). Failures before the first token are gRPC statuses; after it, one terminal
``EngineError`` message (OpenEngine v1 error phases). The last message is
``GenerationFinished`` with usage; the simulated timing rides in trailing metadata
(``tokenkeys-simulated-ttft-us``, ``tokenkeys-simulated-total-us``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc

from tokenkeys._gen.openengine.v1 import generation_pb2, openengine_pb2_grpc
from tokenkeys.engine.proto import (
    finished_response,
    timing_metadata,
    token_response,
)
from tokenkeys.engine.proto_errors import engine_error
from tokenkeys.errors import TokenkeysError, Unavailable
from tokenkeys.server.grpc import status as grpc_status
from tokenkeys.server.grpc.generate_inputs import generate_inputs
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.serving.models import ModelRegistry


class InferenceService(openengine_pb2_grpc.InferenceServicer):
    """Generate for every served model."""

    def __init__(self, models: ModelRegistry, runtime: EngineRuntime) -> None:
        self._models = models
        self._runtime = runtime

    @grpc_status.streaming
    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[generation_pb2.GenerateResponse]:
        model = self._models.get(request.model)
        engine = self._runtime.engine_of(model.name)
        inputs = generate_inputs(request, model)
        rid = inputs.request_id
        outputs = engine.generate(
            inputs.token_ids,
            inputs.params,
            inputs.context,
            request_id=rid,
            lora_name=inputs.lora_name,
        )
        accepted = False
        async with contextlib.aclosing(outputs) as stream:
            try:
                async for output in stream:
                    accepted = True
                    yield token_response(rid, output)
                    if output.finished:
                        context.set_trailing_metadata(timing_metadata(output.timing))
                        yield finished_response(rid, output)
            except TokenkeysError as error:
                if not accepted:
                    raise
                yield generation_pb2.GenerateResponse(request_id=rid, error=engine_error(error))
            if not accepted:
                raise Unavailable(f"the engine of {model.name!r} produced no output", field="model")
