"""Following the KV events of admitted workers: one consumer task per (worker, model).

Each task is owned here, in ``WorkerState.consumers``: started when the worker joins a pool,
cancelled and awaited when it leaves and when the registry closes, so one worker's batches are
applied in order and nothing follows a worker that is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tokenkeys.router.ingest.backoff import BackoffSettings
from tokenkeys.router.ingest.follow import follow_events
from tokenkeys.router.ingest.ingestor import EventIngestor
from tokenkeys.router.workers.discovery import EventSource
from tokenkeys.router.workers.state import WorkerState
from tokenkeys.router.workers.tasks import cancel

#: Called with (worker, model) when events of another spec arrive from it.
ForeignListener = Callable[[WorkerState, str], None]


class EventFollowing:
    """Starts and stops the event consumers of workers; see the module doc."""

    def __init__(
        self,
        *,
        retry_delay: float,
        foreign_interval: float,
        on_foreign: ForeignListener,
        write_backoff: BackoffSettings | None = None,
    ) -> None:
        self.retry_delay = retry_delay
        #: Delays before a worker whose index writes failed is rebuilt (``ingest.backoff``).
        self.write_backoff = write_backoff if write_backoff is not None else BackoffSettings()
        self.foreign_interval = foreign_interval
        self.on_foreign = on_foreign

    def start(
        self, ws: WorkerState, model: str, source: EventSource, ingestor: EventIngestor
    ) -> None:
        """Follow ``model``'s events of ``ws`` from ``source`` until stopped."""
        ws.consumers[model] = asyncio.ensure_future(
            follow_events(
                ws,
                model,
                source,
                ingestor,
                retry_delay=self.retry_delay,
                foreign_interval=self.foreign_interval,
                on_foreign=lambda: self.on_foreign(ws, model),
                backoff=self.write_backoff.new(),
            )
        )

    async def stop(self, ws: WorkerState, model: str) -> None:
        """Stop following ``model`` of ``ws`` and wait until its consumer ended."""
        task = ws.consumers.pop(model, None)
        ws.followers.pop(model, None)
        await cancel(task)

    async def stop_all(self, ws: WorkerState) -> None:
        """Stop every consumer of ``ws``."""
        tasks = list(ws.consumers.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            await cancel(task)
        ws.consumers.clear()
        ws.followers.clear()

    @staticmethod
    def rebuild(workers: dict[str, WorkerState]) -> None:
        """After the index came back: every followed worker is cleared and replayed from 0.

        A gRPC follower resubscribes at once; a ZMQ follower at its next batch, which is when a
        ZMQ subscriber can ask for a replay. Either ends a write backoff's wait at once.
        """
        for ws in workers.values():
            for follower in ws.followers.values():
                follower.rebuild()
