"""A request moved before its first output, on its sender's side.

:mod:`router.replicas.reconcile` finds which of this replica's requests should go to another
worker (a later copy of a new prompt, or a prompt the stream's order balanced); the request's
own task (``router.routed_engine``, ``router.forwarding.door``) waits for its first output or
that move, whichever comes first, and on a move cancels the attempt and sends it on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class Moved(Exception):
    """The request moves: send it to ``worker`` instead (:func:`unless_moved`)."""

    def __init__(self, worker: str) -> None:
        super().__init__(worker)
        self.worker = worker

    def then(self, left: str, rest: list[str]) -> list[str]:
        """The workers to try from here: the peer's, then the one just ``left`` (should the
        peer's fail before answering), then the ``rest`` of the ranking without the peer's."""
        return [self.worker, left, *(a for a in rest if a != self.worker)]


async def unless_moved(
    call: Awaitable[T], move: asyncio.Future[str], discard: Callable[[T], None] | None = None
) -> T:
    """``call``'s result (its first output, or its answer's head), or :class:`Moved` when
    ``move`` resolves first: ``call`` is then cancelled, which aborts the request at its
    worker as a client going away does. Both ready in one instant (a loop that was busy
    while both arrived): the move wins, since nothing of the result has reached the client
    yet; ``discard`` releases that result (an answer's open connection)."""
    step = asyncio.ensure_future(call)
    try:
        await asyncio.wait((step, move), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the caller is cancelled (its client went away)
        await _drop(step, discard)
        raise
    if move.done() and not move.cancelled():
        await _drop(step, discard)
        raise Moved(move.result())
    return step.result()


async def _drop(step: asyncio.Future[T], discard: Callable[[T], None] | None) -> None:
    """Cancel ``step`` (or release what it returned); whatever it raised is left unread."""
    if not step.done():
        step.cancel()
        await asyncio.wait((step,))
    if not step.cancelled() and step.exception() is None and discard is not None:
        discard(step.result())
