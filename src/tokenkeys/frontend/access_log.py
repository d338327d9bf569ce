"""The access log: one line per HTTP request, written once its response body ended.

``--access-log`` on ``serve`` or ``route``. Each line is a record of the ``tokenkeys.access``
logger with the message ``METHOD ROUTE STATUS`` and these fields (text: ``key=value``; JSON:
keys, :mod:`tokenkeys.process.logs`): ``method``, ``route`` (the matched route's path
template, ``unmatched`` otherwise, so client-chosen paths do not enter the log), ``status``,
``duration_ms`` (to the end of the body, streams included), ``prompt_tokens`` (what the
request's generation used, as its usage reports) and ``worker`` (the worker a router sent it
to, from its :data:`WORKER_HEADER` response header). A field the request has none of is left
out.

A pure ASGI middleware (:class:`AccessLog`) wraps the app from outside every other, so what
the others add to the response (the router's headers) is seen; the generation routes note the
prompt tokens (:func:`note_prompt_tokens`) into the request's :class:`AccessRecord`, held in a
context variable as the router's route note is.
"""

from __future__ import annotations

import contextvars
import logging
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("tokenkeys.access")

#: The response header naming the worker a router forwarded the request to.
WORKER_HEADER = "x-tokenkeys-worker"


@dataclass
class AccessRecord:
    """What the routes of one request note for its access line."""

    prompt_tokens: int | None = None


current_access: contextvars.ContextVar[AccessRecord | None] = contextvars.ContextVar(
    "tokenkeys_access", default=None
)


def note_prompt_tokens(count: int) -> None:
    """Add ``count`` prompt tokens to the current request's access line (if it is logged)."""
    record = current_access.get()
    if record is not None:
        record.prompt_tokens = (record.prompt_tokens or 0) + count


def route_label(scope: dict) -> str:
    """The route a request is logged and counted under: the matched route's path template
    (FastAPI leaves the route in the scope), ``unmatched`` for every other path."""
    return getattr(scope.get("route"), "path", None) or "unmatched"


class AccessLog:
    """Pure ASGI middleware writing :mod:`this module <tokenkeys.frontend.access_log>`'s line."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = AccessRecord()
        token = current_access.set(record)
        start = time.perf_counter()
        status = 500  # what the client gets if the app fails before answering
        worker: str | None = None
        logged = False

        def write() -> None:
            route = route_label(scope)
            fields = {
                "method": scope.get("method"),
                "route": route,
                "status": status,
                "duration_ms": round((time.perf_counter() - start) * 1000, 3),
                "prompt_tokens": record.prompt_tokens,
                "worker": worker,
            }
            present = {k: v for k, v in fields.items() if v is not None}
            log.info("%s %s %d", scope.get("method"), route, status, extra={"fields": present})

        async def send_logged(message: dict) -> None:
            nonlocal status, worker, logged
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    if name.decode("latin-1").lower() == WORKER_HEADER:
                        worker = value.decode("latin-1")
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                logged = True
                write()

        try:
            await self.app(scope, receive, send_logged)
        finally:
            current_access.reset(token)
            if not logged:
                write()  # the app failed, or the client left before the body ended
