"""Client channels to a tokenkeys server: plain or TLS, with a bearer token on every call.

The token travels as ``authorization: Bearer <token>`` metadata, added by a client interceptor
so every stub on the channel carries it (the server's gRPC guard reads it). Without TLS the
token crosses the network in clear text: use TLS beyond loopback.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tokenkeys.access.tls import ClientTls

Options = Sequence[tuple[str, Any]]


def _with_token(metadata: Any, value: str) -> list[tuple[str, str]]:
    items = [(k, v) for k, v in (metadata or ()) if k != "authorization"]
    items.append(("authorization", value))
    return items


class _AioToken:
    def __init__(self, value: str) -> None:
        self._value = value

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return details._replace(metadata=_with_token(details.metadata, self._value))


# grpc.aio files an interceptor under the first kind it is an instance of, so each kind of
# call needs its own class.
class _AioUnaryToken(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return await continuation(self._details(client_call_details), request)


class _AioStreamToken(_AioToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return await continuation(self._details(client_call_details), request)


class _Details(
    collections.namedtuple(
        "_Details",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class _SyncToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, value: str) -> None:
        self._value = value

    def _details(self, d: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _Details(
            d.method,
            d.timeout,
            _with_token(d.metadata, self._value),
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(client_call_details), request)


@dataclass(frozen=True)
class ChannelSecurity:
    """How a client reaches a server: ``tls`` (None: plain TCP) and a bearer ``token``."""

    tls: ClientTls | None = None
    token: str | None = None

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        return f"ChannelSecurity(tls={self.tls!r}, token={'set' if self.token else None})"

    def _options(self, options: Options) -> list[tuple[str, Any]]:
        return [*options, *(self.tls.grpc_options() if self.tls is not None else ())]

    def aio_channel(self, target: str, options: Options = ()) -> grpc.aio.Channel:
        """An asyncio channel to ``target``."""
        value = f"Bearer {self.token}"
        interceptors = [_AioUnaryToken(value), _AioStreamToken(value)] if self.token else None
        opts = self._options(options)
        if self.tls is not None:
            return grpc.aio.secure_channel(
                target, self.tls.grpc_credentials(), options=opts, interceptors=interceptors
            )
        return grpc.aio.insecure_channel(target, options=opts, interceptors=interceptors)

    def channel(self, target: str, options: Options = ()) -> grpc.Channel:
        """A blocking channel to ``target``."""
        opts = self._options(options)
        if self.tls is not None:
            channel = grpc.secure_channel(target, self.tls.grpc_credentials(), options=opts)
        else:
            channel = grpc.insecure_channel(target, options=opts)
        if self.token:
            channel = grpc.intercept_channel(channel, _SyncToken(f"Bearer {self.token}"))
        return channel


PLAIN = ChannelSecurity()
