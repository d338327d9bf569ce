"""Helpers shared by the tests: real loopback servers and the ``tokenkeys`` command line."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from typing import Any

from tokenkeys.limits import Limits
from tokenkeys.server.assembly import EngineServer, ServeConfig
from tokenkeys.serving.models import ModelRegistry

REPO = Path(__file__).resolve().parent.parent


class LoopServerThread:
    """A real server on a loopback port, run on its own thread and event loop.

    Subclasses say how to start (``_start`` returns the server and its port) and stop it; tests
    talk to it with ordinary blocking clients, as a router would.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0
        self._error: BaseException | None = None

    async def _start(self) -> tuple[Any, int]:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.server, self.port = self.loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to the starting test
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self):  # noqa: ANN204 - returns the subclass
        self._thread.start()
        self._ready.wait(30)
        if self._error:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


class ServerThread(LoopServerThread):
    """The OpenEngineTokenizer gRPC service of ``models`` on a loopback port."""

    def __init__(self, models: ModelRegistry, limits: Limits | None = None) -> None:
        super().__init__()
        self.models = models
        self.limits = limits or Limits()

    async def _start(self) -> tuple[Any, int]:
        config = ServeConfig(grpc_port=0, limits=self.limits, engine=None)
        server = await EngineServer(self.models, config).start()
        return server, server.grpc_port

    async def _stop(self) -> None:
        await self.server.stop()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def run_cli(  # noqa: ANN201
    *args: str, cwd: Path | None = None, check: bool = True, env_extra: dict | None = None
):
    """Run ``tokenkeys ARGS`` in a subprocess on this checkout's sources."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env_extra or {})}
    result = subprocess.run(
        [sys.executable, "-m", "tokenkeys.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"tokenkeys {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}"
        )
    return result


#: The start of a text log line (tokenkeys.process.logs): UTC time, level, logger.
_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ [\w.]+: ")


def log_message(line: str) -> str:
    """The message of a text log line of a serving command (the line itself if it is none)."""
    return _LOG_PREFIX.sub("", line.rstrip("\n"), count=1)
