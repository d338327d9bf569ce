"""Every failure of the HTTP frontend as an OpenAI error body, with its status from one table.

The body is ``{"error": {"message", "type", "param", "code"}}`` with ``code`` the HTTP status,
as vLLM sends it (``vllm/entrypoints/openai/engine/protocol.py`` ``ErrorResponse``). Status and
type come from :func:`tokenkeys.errors.status_of`; FastAPI's 422 for an invalid body becomes
400, as vLLM remaps it; an unexpected exception is a 500 that names its type, never its trace.

Every error answer that sending the same request again cannot change carries
``x-should-retry: false``: the OpenAI clients retry 408, 409, 429 and every 5xx by default
(``openai._base_client.BaseClient._should_retry``) unless that header says otherwise, so a 501
would otherwise cost three attempts with backoff. Only load and availability answers (429, 503,
504) and a 500, whose cause is unknown, are left to the client's retry policy.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from tokenkeys.errors import TokenkeysError, status_of
from tokenkeys.frontend.body import json_response, validation_error

log = logging.getLogger("tokenkeys.http")

_HTTP_TYPES = {404: "NotFoundError", 405: "MethodNotAllowedError"}
#: Statuses a retry of the same request may turn into a success.
RETRYABLE_STATUSES = frozenset({429, 500, 503, 504})
SHOULD_RETRY = "x-should-retry"


def retry_headers(status: int) -> dict[str, str]:
    """``x-should-retry: false`` for an error status a retry cannot change, else nothing."""
    return {} if status < 400 or status in RETRYABLE_STATUSES else {SHOULD_RETRY: "false"}


def error_json(body: dict, status: int) -> Response:
    """An error body as a response, with the retry header its status calls for."""
    response = json_response(body, status)
    response.headers.update(retry_headers(status))
    return response


def error_body(message: str, kind: str, status: int, param: str | None = None) -> dict:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_of(error: TokenkeysError) -> tuple[int, dict]:
    """HTTP status and body of a tokenkeys error (also used inside event streams)."""
    _, status, kind = status_of(error)
    return status, error_body(error.message, kind, status, error.field)


def error_response(error: TokenkeysError) -> Response:
    """The JSON response of a tokenkeys error."""
    status, body = error_of(error)
    return error_json(body, status)


def error_answer(exc: Exception, method: str, path: str) -> Response:
    """The answer to an exception a route raised on ``method path``: a tokenkeys error's own
    status and body, an invalid body's 400, a 404 or 405 naming the path, and any other
    exception a 500 that names its type (its trace goes to the log)."""
    if isinstance(exc, TokenkeysError):
        return error_response(exc)
    if isinstance(exc, RequestValidationError):
        return error_response(validation_error(list(exc.errors()), "the request"))
    if isinstance(exc, StarletteHTTPException):
        status = exc.status_code
        if status == 404:
            message = f"no route {path!r} on this server; GET /openapi.json lists them"
        elif status == 405:
            message = f"{method} is not allowed on {path!r}"
        else:
            message = str(exc.detail)
        return error_json(error_body(message, _HTTP_TYPES.get(status, "HTTPError"), status), status)
    log.exception("unexpected error on %s %s", method, path, exc_info=exc)
    return error_response(
        TokenkeysError(f"internal error ({type(exc).__name__}); the server log has the details")
    )


async def _answer(request: Request, exc: Exception) -> Response:
    return error_answer(exc, request.method, request.url.path)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception type to its OpenAI error body (:func:`error_answer`)."""
    for kind in (TokenkeysError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, _answer)
