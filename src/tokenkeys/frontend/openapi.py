"""/openapi.json for routes that read their own bodies: request schemas added as components.

Routes declare their body with :func:`request_body` (a ``$ref`` into ``components``), and
:func:`install_openapi` puts the schemas of those request models into the document FastAPI
generates, so the document stays complete and valid (checked by openapi-spec-validator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from tokenkeys.frontend.responses import ErrorResponse

_REF = "#/components/schemas/{model}"

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "invalid body or field"},
    404: {"model": ErrorResponse, "description": "unknown model (the message lists them)"},
    413: {"model": ErrorResponse, "description": "a configured limit was exceeded"},
    501: {"model": ErrorResponse, "description": "not done exactly here; the message says why"},
}


def request_body(*models: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON body of one of ``models``."""
    refs = [{"$ref": _REF.format(model=m.__name__)} for m in models]
    schema = refs[0] if len(refs) == 1 else {"anyOf": refs}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def add_body_route(
    app: FastAPI,
    path: str,
    endpoint: Callable[..., Any],
    *bodies: type[BaseModel],
    summary: str,
    **route: Any,
) -> None:
    """Mount a POST route that reads its own JSON body (one of ``bodies``): the body's schema
    and :data:`ERROR_RESPONSES` are declared for /openapi.json; ``route`` is passed on to
    ``add_api_route`` (``response_model``, ``name``)."""
    app.add_api_route(
        path,
        endpoint,
        methods=["POST"],
        responses=ERROR_RESPONSES,
        openapi_extra=request_body(*bodies),
        summary=summary,
        **route,
    )


def install_openapi(app: FastAPI, models: list[type[BaseModel]], description: str) -> None:
    """Generate /openapi.json once, with the request models among its component schemas."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=description, routes=app.routes
        )
        _, defs = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in defs.get("$defs", {}).items():
            components.setdefault(name, definition)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
