"""``tokenkeys route`` as a real process on a loopback port, for the tests that run the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from support import REPO, log_message


class RouteProcess:
    """``tokenkeys route ARGS`` in a subprocess; ``url`` once it listens."""

    def __init__(self, *args: str, cache: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TOKENKEYS_CACHE": cache}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tokenkeys.cli", "route", "--http-port", "0", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.url = ""

    def __enter__(self) -> RouteProcess:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(log_message(line))
            if "HTTP listening on " in line:
                self.url = "http://" + line.rsplit(" ", 1)[1].strip()
                return self
        _, err = self.proc.communicate(timeout=10)
        raise AssertionError(f"tokenkeys route exited: {self.lines} {err}")

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
