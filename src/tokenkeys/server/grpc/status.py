"""The gRPC boundary: TokenkeysError becomes a status with a clear message, nothing else leaks."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote

import grpc

from tokenkeys.errors import TokenkeysError, status_of

log = logging.getLogger(__name__)
T = TypeVar("T")


def _metadata(error: TokenkeysError) -> tuple[tuple[str, str], ...]:
    """Machine-readable context as trailing metadata (e.g. ``tokenkeys-fingerprint``)."""
    items = []
    if error.field:
        items.append(("tokenkeys-field", error.field))
    for key, value in error.details.items():
        if isinstance(value, (str, int)):
            items.append((f"tokenkeys-{key.replace('_', '-')}", _header_value(str(value))))
    return tuple(items)


# gRPC ASCII metadata carries printable ASCII only; a request's own text (a model name of NUL
# or non-ASCII characters) must not turn the refusal into INTERNAL. Everything else, and '%'
# itself, is percent-encoded (RFC 3986), so printable values stay as they are.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def _header_value(value: str) -> str:
    return quote(value, safe=_HEADER_SAFE)


async def _abort(context: grpc.aio.ServicerContext, error: TokenkeysError) -> None:
    code, _, _ = status_of(error)
    context.set_trailing_metadata(_metadata(error))
    await context.abort(code, error.message)


def unary(
    method: Callable[..., Awaitable[T]],
) -> Callable[..., Awaitable[T]]:
    """Wrap a unary servicer method so TokenkeysError maps to its status code."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            return await method(self, request, context)
        except TokenkeysError as error:
            await _abort(context, error)
            raise AssertionError("unreachable: abort raises") from error

    return wrapper


def streaming(
    method: Callable[..., AsyncIterator[T]],
) -> Callable[..., AsyncIterator[T]]:
    """Wrap a server-streaming servicer method the same way."""

    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[T]:
        try:
            async for item in method(self, request, context):
                yield item
        except TokenkeysError as error:
            await _abort(context, error)

    return wrapper
