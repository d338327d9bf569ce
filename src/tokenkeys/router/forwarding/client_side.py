"""The client's side of a forwarded request: its disconnect, and its body given once more.

The router reads the client's body whole to route it; the frontend's own route (a worker
without an HTTP frontend) reads it again from :func:`replay`. While the router waits for a
worker's first byte, :func:`unless_gone` watches the client: one that disconnects cancels the
wait, which closes the worker's connection and so aborts its request.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    """``call``'s result, or ClientGone (``call`` cancelled) when the client disconnects."""
    task = asyncio.ensure_future(call)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone
