"""A worker's answer on its way back to the client: whole, as server-sent events, or raw.

What the client gets is the worker's (status, headers, body or events); the router reads the
usage it carries for the promise (``promise``) and learns when it ends, to end the request's
trip there. Work that nothing in the answer depends on (metrics, the promise's bookkeeping)
runs once the client has a whole answer (:class:`WholeAnswer`'s ``after``), off the request's
path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response

from tokenkeys.router.forwarding.http1 import Reply
from tokenkeys.router.forwarding.promise import Promise, event_usage
from tokenkeys.router.forwarding.relay import events, raw


class WholeAnswer(Response):
    """A worker's whole answer as it sent it (status, headers and body; the length set as
    Starlette's ``Response(body)`` sets it), then ``after``, once the client has it (also when
    sending failed: it ends what the request holds)."""

    def __init__(
        self,
        body: bytes,
        status: int,
        headers: list[tuple[bytes, bytes]],
        after: Callable[[], None],
    ) -> None:
        self.status_code = status
        self.body = body
        self.background = None
        bodiless = status < 200 or status in (204, 304)  # HTTP forbids a length there
        own = [] if bodiless else [(b"content-length", b"%d" % len(body))]
        self.raw_headers = own + headers
        self._after = after

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        start = {
            "type": "http.response.start",
            "status": self.status_code,
            "headers": self.raw_headers,
        }
        try:
            await send(start)
            await send({"type": "http.response.body", "body": self.body})
        finally:
            self._after()


async def event_relay(
    answer: Reply, promise: Promise, watch: bool, ended: Callable[[Promise, bool], None]
) -> AsyncIterator[bytes]:
    """The worker's events as they come (:func:`~.relay.events`); with ``watch``, the usage
    an event carries answers ``promise``. ``ended(promise, whole)`` once the stream ends,
    ``whole`` False when it did not reach its end (the client left, or it broke)."""
    seen = [promise]

    def on_event(event: bytes) -> None:
        if watch and b'"usage"' in event:
            usage = event_usage(event)
            if usage is not None:
                seen[0] = seen[0].answered(usage)

    whole = False
    try:
        async for chunk in events(answer, on_event):
            yield chunk
        whole = True
    finally:
        ended(seen[0], whole)


async def chunk_relay(answer: Reply, ended: Callable[[], None]) -> AsyncIterator[bytes]:
    """A streamed answer that is not server-sent events, as it comes; ``ended()`` after."""
    try:
        async for chunk in raw(answer):
            yield chunk
    finally:
        ended()
