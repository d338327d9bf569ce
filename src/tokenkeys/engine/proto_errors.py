"""In-band errors of OpenEngine streams: the tokenkeys error tree <-> ``EngineError``.

OpenEngine v1 (docs/api.md @4def7c5, "Standard errors"): before a stream is accepted a failure is
a non-OK gRPC status; after acceptance it is exactly one terminal ``EngineError`` message and the
stream ends with OK. This module is the one mapping between that message and ``errors.py``.
"""

from __future__ import annotations

from tokenkeys._gen.openengine.v1 import error_pb2
from tokenkeys.errors import (
    Cancelled,
    FailedPrecondition,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    TokenkeysError,
    Unavailable,
    Unsupported,
)

# First matching row wins (subclasses before bases): (error class, code, retryable).
_TO_CODE: tuple[tuple[type[TokenkeysError], int, bool], ...] = (
    (InvalidArgument, error_pb2.ERROR_CODE_INVALID_ARGUMENT, False),
    (Unsupported, error_pb2.ERROR_CODE_UNSUPPORTED_FEATURE, False),
    (NotFound, error_pb2.ERROR_CODE_MODEL_NOT_FOUND, False),
    (LimitExceeded, error_pb2.ERROR_CODE_OVERLOADED, True),
    (Unavailable, error_pb2.ERROR_CODE_OVERLOADED, True),
    (Cancelled, error_pb2.ERROR_CODE_CANCELLED, False),
    (FailedPrecondition, error_pb2.ERROR_CODE_INVALID_ARGUMENT, False),
)

_FROM_CODE: dict[int, type[TokenkeysError]] = {
    error_pb2.ERROR_CODE_INVALID_ARGUMENT: InvalidArgument,
    error_pb2.ERROR_CODE_UNSUPPORTED_FEATURE: Unsupported,
    error_pb2.ERROR_CODE_MODEL_NOT_FOUND: NotFound,
    error_pb2.ERROR_CODE_REQUEST_NOT_FOUND: NotFound,
    error_pb2.ERROR_CODE_KV_SESSION_NOT_FOUND: NotFound,
    error_pb2.ERROR_CODE_OVERLOADED: Unavailable,
    error_pb2.ERROR_CODE_DRAINING: Unavailable,
    error_pb2.ERROR_CODE_CANCELLED: Cancelled,
    error_pb2.ERROR_CODE_ROLE_MISMATCH: FailedPrecondition,
    error_pb2.ERROR_CODE_DUPLICATE_REQUEST: FailedPrecondition,
}


def engine_error(error: TokenkeysError) -> error_pb2.EngineError:
    """The terminal in-band message for ``error``."""
    for cls, code, retryable in _TO_CODE:
        if isinstance(error, cls):
            return error_pb2.EngineError(code=code, message=error.message, retryable=retryable)
    return error_pb2.EngineError(
        code=error_pb2.ERROR_CODE_INTERNAL, message=error.message, retryable=False
    )


def draining(message: str) -> error_pb2.EngineError:
    """The terminal message of a stream the server ends because it is stopping."""
    return error_pb2.EngineError(
        code=error_pb2.ERROR_CODE_DRAINING, message=message, retryable=True
    )


def error_of(message: error_pb2.EngineError, where: str) -> TokenkeysError:
    """The tokenkeys error for an ``EngineError`` received from ``where`` (client boundary)."""
    cls = _FROM_CODE.get(message.code, TokenkeysError)
    try:
        code = error_pb2.ErrorCode.Name(message.code)
    except ValueError:  # a newer engine's code; the zero/unknown case per OpenEngine
        code = f"error code {message.code}"
    return cls(f"{where} reported {code}: {message.message}", retryable=message.retryable)
