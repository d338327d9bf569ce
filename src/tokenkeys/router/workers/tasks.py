"""Background tasks with an owner: whoever starts one cancels and awaits it on close."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


async def cancel(task: asyncio.Task | None) -> None:
    """Cancel ``task`` and wait until it ended, whatever it raised."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


class BackgroundTasks:
    """Fire-and-forget work (a load refresh, a spec recheck) that still ends with its owner."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, work: Coroutine[Any, Any, object]) -> asyncio.Task:
        """Run ``work`` in the background until it ends or :meth:`close` cancels it."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Cancel every running task and wait for each."""
        for task in list(self._tasks):
            await cancel(task)
        self._tasks.clear()
