"""The HTTP face of the call guards: a pure ASGI middleware in front of every route.

Builds a :class:`~tokenkeys.serving.guards.Call` from the path, the client address and the
Authorization header, admits it, and releases what the guards hold once the response is
complete (a streamed answer included). A refusal is an OpenAI error body with its status from
the one table: 401 (with ``WWW-Authenticate: Bearer``), 503 while draining, 429 over the
streams of one client.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from tokenkeys.errors import TokenkeysError, Unauthenticated
from tokenkeys.frontend.errors import error_response
from tokenkeys.serving.guards import Call, Guards

#: Health checks (readiness and liveness): served while starting and draining, and without a
#: token unless health is protected.
HEALTH_PATHS = frozenset({"/health", "/livez"})
#: Routes whose calls hold a stream (or a generation) open: they count against
#: ``max_streams_per_client``.
STREAMING_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


def call_of(scope: dict) -> Call:
    """What the guards know of an HTTP request: its path, client address and credentials."""
    path = scope["path"]
    authorization = None
    for key, value in scope["headers"]:
        if key == b"authorization":
            authorization = value.decode("latin-1")
            break
    client = scope.get("client")
    return Call(
        route=path,
        client=client[0] if client else "unknown",
        authorization=authorization,
        streaming=path in STREAMING_PATHS,
        health=path in HEALTH_PATHS,
    )


def refusal(error: TokenkeysError) -> Response:
    """The answer to a request the guards refused (401s name the Bearer scheme)."""
    response = error_response(error)
    if isinstance(error, Unauthenticated):
        response.headers["www-authenticate"] = 'Bearer realm="tokenkeys"'
    return response


class GuardMiddleware:
    """Admits every HTTP request through ``guards`` before the app sees it."""

    def __init__(self, app: Any, guards: Guards) -> None:
        self.app = app
        self.guards = guards

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            release = self.guards.admit(call_of(scope))
        except TokenkeysError as error:
            await refusal(error)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            release()
