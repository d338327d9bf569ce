"""A vLLM that is not up yet, as its clients see it: its address refuses connections.

A real TCP relay on a free loopback port to a running vLLM, listening only once :meth:`open`
is called: a sidecar pointed at it waits as it would for a vLLM still loading its model, without
starting a vLLM for that (``test_vllm_sidecar_start.py``, ``test_vllm_routing.py``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from ports import free_port


class LateDoor:
    """A TCP relay to ``host:port`` on a free loopback port that listens only once opened."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.Server | None = None

    def open(self) -> None:
        async def start() -> asyncio.Server:
            return await asyncio.start_server(self._relay, "127.0.0.1", self.port)

        self._server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:  # the target is down (a test stopped it): the client sees a reset
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            finally:
                sink.close()

        await asyncio.gather(
            pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True
        )

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)

    def open_once(self, waiting: Callable[[], bool], limit: float = 120.0) -> None:
        """Open when ``waiting()`` says the client was seen waiting (``limit`` seconds at most:
        a safety net, never a criterion)."""
        deadline = time.monotonic() + limit
        while not waiting():
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing waited for the door in {limit:.0f} s")
            time.sleep(0.05)
        self.open()
