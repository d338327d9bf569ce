"""A real vLLM server's KV events, received with tokenkeys' own subscriber and codec.

:class:`EventCollector` runs :class:`~tokenkeys.events.zmq_subscriber.ZmqEventSubscriber` on a
thread of its own (its own event loop), decodes every payload with
:class:`~tokenkeys.events.vllm_codec.VllmMsgpackCodec` and keeps both, so blocking tests can wait
for a condition on what arrived. The subscriber starts from sequence 0 with the replay endpoint,
so batches published before the SUB socket joined are replayed, not lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tokenkeys.events.model import BlockStored, EventBatch
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_subscriber import ZmqEventSubscriber

WAIT_LIMIT = 120.0  # seconds: a safety net for a broken engine, never a pass/fail criterion


@dataclass(frozen=True)
class Received:
    """One batch as it came off the wire, and as tokenkeys decoded it."""

    seq: int
    payload: bytes
    batch: EventBatch


class EventCollector:
    """Collects every batch of one vLLM publisher until :meth:`close`."""

    def __init__(self, endpoint: str, replay_endpoint: str, topic: str, version: str) -> None:
        self.codec = VllmMsgpackCodec(version)
        self._subscriber = ZmqEventSubscriber(
            endpoint, replay_endpoint=replay_endpoint, topic=topic, start_seq=0
        )
        self._received: list[Received] = []
        self._changed = threading.Condition()
        self._error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._task = self._loop.create_task(self._receive())
        self._started.set()
        with contextlib.suppress(asyncio.CancelledError):
            self._loop.run_until_complete(self._task)
        self._loop.run_until_complete(self._subscriber.close())
        self._loop.close()

    async def _receive(self) -> None:
        await self._subscriber.start()
        try:
            async for delivery in self._subscriber:
                batch = self.codec.decode(delivery.payload)
                with self._changed:
                    self._received.append(Received(delivery.seq, delivery.payload, batch))
                    self._changed.notify_all()
        except Exception as exc:  # reported to the waiting test
            with self._changed:
                self._error = exc
                self._changed.notify_all()

    def received(self) -> list[Received]:
        with self._changed:
            return list(self._received)

    def stored(self) -> list[BlockStored]:
        """Every BlockStored event so far, in publication order."""
        return [e for r in self.received() for e in r.batch.events if isinstance(e, BlockStored)]

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        """Block until ``condition()`` holds; fail with ``what`` if the engine never gets there."""
        deadline = time.monotonic() + WAIT_LIMIT
        with self._changed:
            while not condition():
                if self._error is not None:
                    raise AssertionError(f"event subscriber failed: {self._error!r}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"vLLM never published {what}")
                self._changed.wait(min(left, 1.0))

    def close(self) -> None:
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)
