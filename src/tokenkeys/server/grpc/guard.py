"""The gRPC face of the call guards: one server interceptor that wraps every method handler.

For each call it builds a :class:`~tokenkeys.serving.guards.Call` from the method, the peer and
the ``authorization`` metadata, admits it, and releases what the guards hold when the call
ends, streams included. A refusal is a status from the one status table (UNAUTHENTICATED,
UNAVAILABLE, RESOURCE_EXHAUSTED) with the guard's message; the servicers never see the call.

The wrapped handlers also parse the request themselves, after admission: gRPC would answer a
message that does not parse with INTERNAL, which says "server bug"; here it is
INVALID_ARGUMENT naming the message type.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from tokenkeys.errors import TokenkeysError, status_of
from tokenkeys.serving.guards import Call, Guards, client_of

#: Health checks: served while draining, and without a token unless health is protected.
HEALTH_METHODS = frozenset({"/openengine.v1.Control/Health"})


def _authorization(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class GuardInterceptor(grpc.aio.ServerInterceptor):
    """Admits every call through ``guards``; wrapped handlers are built once per method."""

    def __init__(self, guards: Guards) -> None:
        self._guards = guards
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None:
            return None  # an unknown method: gRPC answers UNIMPLEMENTED
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = wrapped
        return wrapped

    async def _admit(
        self, method: str, context: grpc.aio.ServicerContext, streaming: bool
    ) -> Callable[[], None]:
        call = Call(
            route=method,
            client=client_of(context.peer() or ""),
            authorization=_authorization(context),
            streaming=streaming,
            health=method in HEALTH_METHODS,
        )
        try:
            return self._guards.admit(call)
        except TokenkeysError as error:
            code, _, _ = status_of(error)
            await context.abort(code, error.message)
            raise AssertionError("unreachable: abort raises") from error

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        admit = self._admit
        deserialize = handler.request_deserializer

        async def parse(raw: Any, context: grpc.aio.ServicerContext) -> Any:
            if deserialize is None:
                return raw
            try:
                return deserialize(raw)
            except Exception as exc:  # protobuf's DecodeError, or anything a parser raises
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the request of {method} is not a valid message ({len(raw)} bytes): {exc}",
                )
                raise AssertionError("unreachable: abort raises") from exc

        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(raw: Any, context: grpc.aio.ServicerContext) -> Any:
                release = await admit(method, context, False)
                try:
                    return await inner_unary(await parse(raw, context), context)
                finally:
                    release()

            return grpc.unary_unary_rpc_method_handler(unary, None, handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(raw: Any, context: grpc.aio.ServicerContext) -> AsyncIterator:
                release = await admit(method, context, True)
                try:
                    request = await parse(raw, context)
                    if inspect.isasyncgenfunction(inner_stream):
                        async for item in inner_stream(request, context):
                            yield item
                    else:  # a handler that writes with context.write
                        await inner_stream(request, context)
                finally:
                    release()

            return grpc.unary_stream_rpc_method_handler(stream, None, handler.response_serializer)
        # Client and bidirectional streams: no service here has one; pass them through.
        return handler
