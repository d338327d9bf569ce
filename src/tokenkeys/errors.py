"""The one exception tree of tokenkeys and the one table that maps it to gRPC and HTTP.

Every error a caller can see is a :class:`TokenkeysError`. Each subclass names a *kind* of failure;
:data:`STATUS_TABLE` says, once, which gRPC status code and HTTP status each kind becomes.
Foreign exceptions (from Redis, ZMQ, msgpack, tokenizers, jinja2) are translated into this tree
where they are caught, never passed through, so nothing reaches a client as INTERNAL by accident.

Messages follow one rule: say what was received, what is allowed, and how to fix it.
"""

from __future__ import annotations

from typing import Any

import grpc


class TokenkeysError(Exception):
    """Base of every error tokenkeys reports to a caller.

    ``field`` names the request field (or file, or option) at fault when there is one;
    ``details`` carries machine-readable context (for example the current fingerprint).
    """

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details


class InvalidArgument(TokenkeysError):
    """A request field has a value that is never acceptable (wrong type, out of range)."""


class NotFound(TokenkeysError):
    """A named thing (model, file, profile) does not exist here."""


class FailedPrecondition(TokenkeysError):
    """The request is well formed but the server state disagrees (e.g. a stale fingerprint)."""


class LimitExceeded(TokenkeysError):
    """A configured limit (request size, tokens, texts, artifact size) was exceeded."""


class Unsupported(TokenkeysError):
    """The request asks for something this deployment does not do exactly; never approximated."""


class Unavailable(TokenkeysError):
    """A dependency (remote engine, Redis, event source) cannot be reached right now."""


class OutOfRange(InvalidArgument):
    """A position (e.g. a KV-event sequence number to resume from) is outside what is kept."""


class DataLoss(TokenkeysError):
    """A stream lost items it cannot recover (a subscriber fell behind); start it over."""


class Cancelled(TokenkeysError):
    """The operation was cancelled by its caller (interrupt, client cancellation)."""


class DeadlineExceeded(TokenkeysError):
    """The operation did not finish before its deadline."""


class TokenizerLoadError(FailedPrecondition):
    """A tokenizer folder does not load; the message names the file and the cause."""


class ArtifactError(FailedPrecondition):
    """A tokenizer artifact transfer broke a rule (digest, size, order, path); nothing installed."""


class ConfigError(InvalidArgument):
    """A server or client configuration value is invalid (reported at start, before serving)."""


class Unauthenticated(TokenkeysError):
    """The request carries no valid credentials (bearer token) for a server that requires them."""


class TemplateLimitExceeded(InvalidArgument, LimitExceeded):
    """A chat template went past a render limit (time, output, values built, range items).

    A limit, but the template is at fault rather than the request's size: reported as a bad
    argument (HTTP 400, INVALID_ARGUMENT), since :class:`InvalidArgument` comes first in
    :data:`STATUS_TABLE`.
    """


class ContextLengthExceeded(InvalidArgument, LimitExceeded):
    """A request does not fit the model's context (``max_model_len``).

    A limit of the model, refused as a bad request (HTTP 400 ``BadRequestError``,
    INVALID_ARGUMENT) as vLLM and OpenAI do, since :class:`InvalidArgument` comes first in
    :data:`STATUS_TABLE`.
    """


def vllm_invalid(
    message: str,
    parameter: str | None = None,
    value: Any = None,
    *,
    kind: type[InvalidArgument] = InvalidArgument,
) -> InvalidArgument:
    """A 400 worded as vLLM 0.32 words its ``VLLMValidationError``: the message, then
    ``(parameter=P, value=V)`` for those it names (``vllm/exceptions.py`` ``__str__``), so a
    client matching vLLM's text matches ours. ``field`` is the parameter; ``kind`` the class
    (e.g. :class:`ContextLengthExceeded`), any :class:`InvalidArgument`."""
    extras = [f"{k}={v}" for k, v in (("parameter", parameter), ("value", value)) if v is not None]
    text = f"{message} ({', '.join(extras)})" if extras else message
    return kind(text, field=parameter)


class TooManyRequests(LimitExceeded):
    """A client holds too many concurrent streams; it may retry once one of them ends."""


# One row per kind: (gRPC status, HTTP status, OpenAI error type). Order matters: the first row
# whose class the error is an instance of wins, so subclasses come before their bases.
STATUS_TABLE: tuple[tuple[type[TokenkeysError], grpc.StatusCode, int, str], ...] = (
    (OutOfRange, grpc.StatusCode.OUT_OF_RANGE, 400, "BadRequestError"),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, 400, "BadRequestError"),
    (NotFound, grpc.StatusCode.NOT_FOUND, 404, "NotFoundError"),
    (ArtifactError, grpc.StatusCode.DATA_LOSS, 502, "ArtifactError"),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION, 409, "FailedPreconditionError"),
    (TooManyRequests, grpc.StatusCode.RESOURCE_EXHAUSTED, 429, "RateLimitError"),
    (LimitExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED, 413, "RequestTooLargeError"),
    (Unsupported, grpc.StatusCode.UNIMPLEMENTED, 501, "NotImplementedError"),
    (Unavailable, grpc.StatusCode.UNAVAILABLE, 503, "ServiceUnavailableError"),
    (DataLoss, grpc.StatusCode.DATA_LOSS, 500, "InternalServerError"),
    (Cancelled, grpc.StatusCode.CANCELLED, 499, "CancelledError"),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED, 504, "TimeoutError"),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, 401, "AuthenticationError"),
    (TokenkeysError, grpc.StatusCode.INTERNAL, 500, "InternalServerError"),
)


def status_of(error: TokenkeysError) -> tuple[grpc.StatusCode, int, str]:
    """Return (gRPC status code, HTTP status, OpenAI error type) for an error."""
    for cls, code, http, kind in STATUS_TABLE:
        if isinstance(error, cls):
            return code, http, kind
    raise AssertionError("unreachable: TokenkeysError is the last row")


_CODE_TO_CLASS: dict[grpc.StatusCode, type[TokenkeysError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.DATA_LOSS: ArtifactError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: LimitExceeded,
    grpc.StatusCode.UNIMPLEMENTED: Unsupported,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}


def from_grpc(error: grpc.RpcError) -> TokenkeysError:
    """Translate a gRPC error received by a client into the tokenkeys tree (client boundary)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    cls = _CODE_TO_CLASS.get(code, TokenkeysError)
    # The server puts machine-readable context in trailing metadata (tokenkeys-<name>).
    context: dict[str, Any] = {}
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailing or ():
        if key.startswith("tokenkeys-") and isinstance(value, str):
            context[key.removeprefix("tokenkeys-").replace("-", "_")] = value
    field = context.pop("field", None)
    return cls(f"{details} (gRPC {code.name})", field=field, grpc_code=code.name, **context)
