"""``tokenkeys serve`` in a subprocess with free gRPC and HTTP ports, read from its output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence

from support import REPO


class Served:
    """The server process; ``grpc_target`` and ``http_address`` once both listen.

    Its output is collected on a thread (``lines``, ``errors``) so the pipes never fill up.
    """

    def __init__(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        preexec: Callable[[], None] | None = None,
        program: Sequence[str] | None = None,
    ) -> None:
        # ``program``: an installed ``tokenkeys`` (a virtualenv's console script), run outside
        # the checkout with nothing of it on its path; by default the checkout's own code.
        installed = program is not None
        base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if not installed:
            program = [sys.executable, "-m", "tokenkeys.cli"]
            base["PYTHONPATH"] = str(REPO / "src")
        self.proc = subprocess.Popen(
            [*program, "serve", "--grpc-port", "0", "--http-port", "0", "--no-kv-events", *args],
            env={**base, **(env or {})},
            cwd="/" if installed else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=preexec,  # e.g. a lower descriptor limit for the child only
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self.grpc_target = self.http_address = ""
        self._listening = threading.Event()
        self._readers = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith("gRPC listening on "):
                self.grpc_target = line.split()[-1]
            if line.startswith("HTTP listening on "):
                self.http_address = line.split()[-1]
                self._listening.set()
        self._listening.set()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors.append(line.rstrip("\n"))

    def __enter__(self) -> Served:
        self._listening.wait(60)
        if not self.http_address:
            self.stop()
            raise AssertionError(f"serve did not start: {self.lines} {self.errors}")
        return self

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        """Exit code, once the process ended and its output was read."""
        code = self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(5)
        return code

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.wait(10)

    def __exit__(self, *exc: object) -> None:
        self.stop()
