"""Several worker processes behind one port: ``serve --processes N`` and ``route --processes N``.

One process runs one asyncio event loop, and the encodes, JSON and protobuf work of a request
hold the GIL for most of their time, so one process serves from about one core. N worker
processes, each building the whole server through its builder (``EngineServer`` or
``RouterProcess``), serve from N cores.

They share the ports with SO_REUSEPORT: every worker listens on the same address and the kernel
spreads new connections over the listening sockets (gRPC core and our uvicorn socket both set
the option; see ``reuse_port`` in the builders). The supervisor first reserves each port (bound
with SO_REUSEPORT, never listening, so it takes no connection): ``--http-port 0`` then names one
port for every worker, and a port another program holds is refused before any worker starts.

What is shared is shared by construction: every worker loads the same files with the same
options (hence the same fingerprints and specs), and the caller fixes per-process defaults such
as the instance id before the workers start. What cannot be shared is refused by the caller:
the simulated engine keeps its prefix cache and KV events in its own process.

The supervisor (:class:`Supervisor`) starts the workers (``spawn``: no state of the supervisor
leaks into them), waits until each reports ready over its pipe, and prints the first one's
description once. A worker that exits after it was ready is restarted; one that dies before it
was ready (a configuration or environment fault, which retrying would not mend) stops them all
with exit status 1. SIGTERM or SIGINT is forwarded to every worker as SIGTERM (each drains as a
single-process server does); the supervisor exits when all have, 0 if every worker exited 0.
A second signal is forwarded too (workers then stop at once). A worker whose supervisor is gone
(its pipe closes) drains and exits as on SIGTERM, so no worker outlives a killed supervisor.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType

from tokenkeys.errors import ConfigError, TokenkeysError
from tokenkeys.process import logs

#: Upper bound of ``--processes`` (a guard against a typo starting thousands of processes).
MAX_WORKERS = 256


@dataclass
class WorkerLink:
    """What a worker process gets from its supervisor: its index and its pipe."""

    index: int
    conn: Connection

    def ready(self, lines: list[str]) -> None:
        """Tell the supervisor this worker serves; ``lines`` describe it (printed once)."""
        self.conn.send(lines)

    def watch(self, on_gone: Callable[[], None]) -> None:
        """Call ``on_gone`` in the running loop when the supervisor's end of the pipe closes.

        The supervisor never writes after start, so readable means closed.
        """
        loop = asyncio.get_running_loop()
        fd = self.conn.fileno()

        def readable() -> None:
            loop.remove_reader(fd)
            on_gone()

        loop.add_reader(fd, readable)


def announce(lines: list[str], link: WorkerLink | None) -> None:
    """Print what a server serves, or, in a worker, hand it to the supervisor (printed once)."""
    if link is not None:
        link.ready(lines)
        return
    for line in lines:
        logs.lifecycle().info("%s", line)


#: A command's worker body: serve until drained, return the exit status.
WorkerMain = Callable[[argparse.Namespace, WorkerLink], int]


def check_worker_count(count: int) -> None:
    """``--processes`` must be 1..MAX_WORKERS."""
    if not isinstance(count, int) or not 1 <= count <= MAX_WORKERS:
        raise ConfigError(
            f"--processes must be 1..{MAX_WORKERS}, got {count!r} (one per core is a good start; "
            f"this machine has {os.cpu_count()})",
            field="processes",
        )


def reserve_port(host: str, port: int, option: str) -> socket.socket:
    """A socket bound to ``host:port`` with SO_REUSEPORT that never listens: it holds the port
    (0 picks one) for the workers, which bind the same port with the same option."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot bind {option} {port} on {host}: {exc}", field=option.lstrip("-")
        ) from exc
    return sock


def _worker_entry(main: WorkerMain, args: argparse.Namespace, index: int, conn: Connection) -> None:
    # A terminal's Ctrl-C reaches the whole process group; the supervisor forwards it as
    # SIGTERM, so a worker seeing it twice would skip its drain.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = main(args, WorkerLink(index, conn))
    except TokenkeysError as error:
        logging.getLogger("tokenkeys.worker").error(
            "tokenkeys worker %d: error: %s", index, error.message
        )
        code = 2
    sys.exit(code)


@dataclass
class _Slot:
    index: int
    process: BaseProcess
    conn: Connection
    ready: bool = False
    exited: bool = False


class Supervisor:
    """Runs ``count`` workers of ``main`` over ``args`` until a signal; see the module doc.

    ``ports`` names the ``args`` attributes holding ports to share, with their option name
    (e.g. ``[("http_port", "--http-port")]``); the reserved ports are written back into
    ``args`` before the workers start.
    """

    def __init__(
        self,
        main: WorkerMain,
        args: argparse.Namespace,
        count: int,
        ports: Sequence[tuple[str, str]],
        *,
        say: Callable[[str], None] | None = None,
    ) -> None:
        check_worker_count(count)
        self.main = main
        self.args = args
        self.count = count
        self.say = say or (lambda line: logs.lifecycle().info("%s", line))
        self._context = multiprocessing.get_context("spawn")
        self._reserved: list[socket.socket] = []
        try:
            for attr, option in ports:
                sock = reserve_port(args.host, getattr(args, attr), option)
                self._reserved.append(sock)
                setattr(args, attr, sock.getsockname()[1])
        except BaseException:
            self._release()
            raise
        self.slots: list[_Slot] = []
        self._signals: list[int] = []
        self._draining = False
        self._failed = False
        self._first_lines: list[str] = []

    def run(self) -> int:
        """Start the workers, supervise them until a signal drains them; the exit status."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        old_fd = signal.set_wakeup_fd(wake_w)
        for sig in previous:
            signal.signal(sig, self._on_signal)
        try:
            self.slots = [self._spawn(i) for i in range(self.count)]
            return self._supervise(wake_r)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(old_fd)
            os.close(wake_r)
            os.close(wake_w)
            self._stop_all(signal.SIGKILL)
            self._release()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def _spawn(self, index: int) -> _Slot:
        parent, child = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=_worker_entry,
            args=(self.main, self.args, index, child),
            name=f"tokenkeys-worker-{index}",
        )
        process.start()
        child.close()
        return _Slot(index, process, parent)

    def _supervise(self, wake: int) -> int:
        announced = False
        while True:
            live = [s for s in self.slots if not s.exited]
            if not live:
                break
            waitables: list = [wake] + [s.process.sentinel for s in live]
            waitables += [s.conn for s in live if not s.ready]
            ready = wait(waitables)
            if wake in ready:
                self._take_signals(wake)
            for slot in live:
                if not slot.ready and slot.conn in ready:
                    self._on_ready(slot, announced)
                if slot.process.sentinel in ready:
                    self._on_exit(slot)
            if not announced and not self._draining and all(s.ready for s in self.slots):
                announced = True
                pids = ", ".join(str(s.process.pid) for s in self.slots)
                self.say(f"workers: {self.count} processes (pids {pids}) sharing the ports")
                for line in self._first_lines:
                    self.say(line)
        codes = [s.process.exitcode for s in self.slots]
        return 1 if self._failed or any(c != 0 for c in codes) else 0

    def _take_signals(self, wake: int) -> None:
        try:
            while os.read(wake, 512):
                pass
        except BlockingIOError:
            pass
        signals, self._signals = self._signals, []
        for signum in signals:
            if not self._draining:
                self._draining = True
                self.say(f"{signal.Signals(signum).name}: draining {self.count} workers")
            self._stop_all(signal.SIGTERM)

    def _on_ready(self, slot: _Slot, announced: bool) -> None:
        try:
            lines = slot.conn.recv()
        except (EOFError, OSError):
            return  # it died before it was ready: its sentinel says so
        slot.ready = True
        if slot.index == 0 and not announced:
            self._first_lines = list(lines)
        if announced:
            self.say(f"worker {slot.index} restarted (pid {slot.process.pid})")

    def _on_exit(self, slot: _Slot) -> None:
        slot.process.join()
        slot.exited = True
        code = slot.process.exitcode
        if self._draining:
            return
        if not slot.ready:
            self._failed = self._draining = True
            self.say(
                f"worker {slot.index} (pid {slot.process.pid}) exited with status {code} before "
                "it served; stopping the others"
            )
            self._stop_all(signal.SIGTERM)
            return
        self.say(
            f"worker {slot.index} (pid {slot.process.pid}) exited with status {code}; restarting it"
        )
        slot.conn.close()
        self.slots[slot.index] = self._spawn(slot.index)

    def _stop_all(self, signum: int) -> None:
        for slot in self.slots:
            if not slot.exited and slot.process.pid is not None:
                try:
                    os.kill(slot.process.pid, signum)
                except ProcessLookupError:
                    pass
        if signum == signal.SIGKILL:
            for slot in self.slots:
                if not slot.exited:
                    slot.process.join()
                    slot.exited = True

    def _release(self) -> None:
        for sock in self._reserved:
            sock.close()
        self._reserved = []
