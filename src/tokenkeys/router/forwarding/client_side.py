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

    ``call`` runs in the caller's own task, which the watch of the client cancels (one task
    per request rather than two and a wait: the forwarded path's own cost, bench_front_door).
    """
    current = asyncio.current_task()
    assert current is not None
    watching = True

    def cancel_call(gone: asyncio.Future) -> None:
        if watching and not gone.cancelled():
            current.cancel()

    gone = asyncio.ensure_future(_disconnected(request))
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
        gone.cancel()
