"""JSON in and out: reading a bounded request body, validating it, answering with orjson.

Routes read the raw body themselves instead of declaring pydantic parameters: the body then
reaches the Preprocessor exactly as the client sent it (extra fields included, which the chat
prologue reads), and the hot /tokenize path skips FastAPI's dependency machinery. The models of
:mod:`~tokenkeys.frontend.schemas` still validate every body and document it in /openapi.json.
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tokenkeys.errors import InvalidArgument, LimitExceeded

M = TypeVar("M", bound=BaseModel)

_JSON = "application/json"


def json_response(data: Any, status_code: int = 200) -> Response:
    """Serialize ``data`` with orjson (about ten times faster than json for id lists)."""
    return Response(orjson.dumps(data), status_code=status_code, media_type=_JSON)


def _too_large(size: int, limit: int) -> LimitExceeded:
    return LimitExceeded(
        f"the request body has {size} bytes or more; at most {limit} are allowed "
        "(max_request_bytes): split the request",
        field="body",
        limit=limit,
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 as soon as it is known to exceed ``limit`` bytes.

    Read from the request's own ``receive`` and raw headers: Starlette's ``Request.headers``
    copies the header list and its ``stream()`` is an async generator, a few thousand
    instructions a request on the router's forwarded path (docs/benchmarks.md, "Front door").
    """
    content_type = declared = None
    for name, value in request.scope["headers"]:
        if name == b"content-type" and content_type is None:
            content_type = value.decode("latin-1")
        elif name == b"content-length" and declared is None:
            declared = value.decode("latin-1")
    if (content_type or "").split(";", 1)[0].strip().lower() != _JSON:
        # vLLM answers 400 to anything but JSON (vllm/entrypoints/utils.py validate_json_request).
        raise InvalidArgument(
            f"Content-Type is {content_type or 'missing'!r}; send the body as JSON with "
            "Content-Type: application/json",
            field="body",
        )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left (Starlette's stream() says so)
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_object(raw: bytes) -> dict[str, Any]:
    """Parse a JSON object; anything else is a 400 naming what was received."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"the body is not valid JSON: {exc}", field="body") from None
    if not isinstance(data, dict):
        raise InvalidArgument(
            f"the body must be a JSON object, got {type(data).__name__}", field="body"
        )
    return data


def validate(model: type[M], data: dict[str, Any]) -> M:
    """Validate ``data`` against a schema model; errors become one 400 listing each problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors(), model.__name__) from None


def validation_error(errors: list[Any], what: str) -> InvalidArgument:
    """One InvalidArgument for pydantic/FastAPI errors, naming each field, problem and value."""
    parts = []
    for err in errors[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        got = err.get("input")
        shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
        parts.append(f"{loc}: {err.get('msg', 'invalid')} (got {shown[:80]})")
    first = errors[0].get("loc", ()) if errors else ()
    field = next((str(p) for p in first if p != "body"), "body")
    count = len(errors)
    return InvalidArgument(
        f"{count} validation error{'s' if count != 1 else ''} in {what}: " + "; ".join(parts),
        field=field,
    )
