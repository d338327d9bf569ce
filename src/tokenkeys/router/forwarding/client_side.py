"""The client's side of a forwarded request: its disconnect, and its body given once more.

The router reads the client's body whole to route it; the frontend's own route (a worker
without an HTTP frontend) reads it again from :func:`replay`. While the router waits for a
worker's first byte, :func:`unless_gone` watches the client: one that disconnects cancels the
wait, which closes the worker's connection and so aborts its request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request

from tokenkeys.transport.http_protocol import DISCONNECT

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the worker answered."""


def replay(body: bytes, receive: Callable[[], Awaitable[dict]]) -> Callable[[], Awaitable[dict]]:
    """An ASGI receive that gives ``body`` once, then the client's (its disconnect)."""
    given = False

    async def replay() -> dict:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(request: Request, call: Awaitable[T]) -> T:
    """``call``'s result, or ClientGone (``call`` cancelled) when the client disconnects.

    ``call`` runs in the caller's own task, which the client's disconnect cancels. The server's
    future of the connection (``transport.http_protocol.DISCONNECT``) says when; a server
    without it is watched by a task reading ``receive()``.
    """
    current = asyncio.current_task()
    assert current is not None
    watching = True

    def cancel_call(_: asyncio.Future) -> None:
        if watching:
            current.cancel()

    lost = request.scope.get("extensions", {}).get(DISCONNECT)
    gone = lost if lost is not None else asyncio.ensure_future(_disconnected(request))
    gone.add_done_callback(cancel_call)
    try:
        return await call
    except asyncio.CancelledError:
        if not gone.done() or gone.cancelled():
            raise  # cancelled from outside, not by the client's disconnect
        # The cancellation was ours: the caller's task goes on (Python 3.11+ counts them).
        uncancel = getattr(current, "uncancel", None)
        if uncancel is not None:
            uncancel()
        raise ClientGone from gone.exception()
    finally:
        watching = False
        gone.remove_done_callback(cancel_call)  # the connection's future outlives the request
        if gone is not lost:
            gone.cancel()
