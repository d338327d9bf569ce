"""The ``x-tokenkeys-*`` response headers of a routed request (docs/router.md explains them).

A fresh :class:`~tokenkeys.router.routed_engine.RouteNote` is set for every request before
it is routed; whoever routes it (the front door, the routed engine, also from a streaming
body's task: a copied context holds the same note) records the decisions there, and the
headers are added to the response's start, which for a stream follows its first token.
:class:`RouteHeaders` does this in front of the frontend's routes, and the forwarded routes'
own layer (:mod:`tokenkeys.router.forwarding.asgi`) with the same :func:`with_route_headers`.
"""

from __future__ import annotations

from typing import Any

from tokenkeys.frontend.access_log import WORKER_HEADER
from tokenkeys.router.explain.endpoint import HEADER_EXPLAIN, header_value
from tokenkeys.router.forwarding.promise import promise_headers
from tokenkeys.router.routed_engine import RouteNote, current_note

#: Response headers of a routed request; several prompts (a completions batch) give
#: comma-separated values in prompt order.
HEADER_WORKER = WORKER_HEADER
HEADER_SCORE = "x-tokenkeys-score"
HEADER_MATCHED = "x-tokenkeys-matched-blocks"
HEADER_POLICY = "x-tokenkeys-policy"
HEADER_REASON = "x-tokenkeys-reason"
#: Workers that failed before the first byte of their answer (forwarded requests).
HEADER_RETRIES = "x-tokenkeys-retries"


_WORKER, _SCORE, _MATCHED, _POLICY, _REASON, _RETRIES, _EXPLAIN = (
    name.encode()
    for name in (
        HEADER_WORKER,
        HEADER_SCORE,
        HEADER_MATCHED,
        HEADER_POLICY,
        HEADER_REASON,
        HEADER_RETRIES,
        HEADER_EXPLAIN,
    )
)


def route_headers(note: RouteNote) -> list[tuple[bytes, bytes]]:
    """The ``x-tokenkeys-*`` headers of a request's routing decisions."""
    decisions = note.decisions
    served = note.served_by or [d.worker for d in decisions]

    def join(values: list[str]) -> bytes:
        return ",".join(values).encode("latin-1")

    matched = [f"{d.matched_blocks}/{d.total_blocks}" for d in decisions]
    headers = [
        (_WORKER, join(served)),
        (_SCORE, join([f"{d.score:.4f}" for d in decisions])),
        (_MATCHED, join(matched)),
        (_POLICY, join(sorted({d.policy for d in decisions}))),
        (_REASON, join([d.reason for d in decisions])),
    ]
    if note.promise is not None:  # a forwarded request
        headers.append((_RETRIES, b"%d" % note.retries))
        headers += promise_headers(note.promise)
    if note.explanation is not None:
        part, blocks = note.explanation
        headers.append((_EXPLAIN, header_value(part, note.promise, blocks)))
    return headers


def with_route_headers(message: dict, note: RouteNote) -> dict:
    """An ASGI message, with the note's headers added when it starts a routed response."""
    if message["type"] == "http.response.start" and note.decisions:
        return {**message, "headers": [*message.get("headers", []), *route_headers(note)]}
    return message


class RouteHeaders:
    """Pure ASGI middleware: a fresh note per request, reported in headers (module doc)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        note = RouteNote()
        token = current_note.set(note)

        async def send_with_headers(message: dict) -> None:
            await send(with_route_headers(message, note))

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            current_note.reset(token)
