"""One supervised run for every serving command: ``serve`` and ``route`` alike.

A command hands :func:`run_served` a :data:`Start` (build and start its server from the parsed
options, and describe it) and the options holding ports to share. With ``--processes 1`` the
server runs in this process; with more, the :class:`~tokenkeys.process.supervisor.Supervisor`
runs that many workers, each one the same :func:`serve_until_signal`.

Shutdown is the same everywhere: the first SIGTERM/SIGINT (a worker hears SIGTERM only, from
its supervisor, and the supervisor's going away) drains the server up to ``--shutdown-timeout``
seconds, a second signal cuts the drain short, then the server stops and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn, Protocol

from tokenkeys.process import logs
from tokenkeys.process.supervisor import Supervisor, WorkerLink, announce
from tokenkeys.serving.lifecycle import Lifecycle, exit_stopped

#: After the drain, what the servers still give the calls that outlived the deadline.
STOP_GRACE = 1.0


class Served(Protocol):
    """A started server a command runs until a signal (``EngineServer``, ``RouterProcess``)."""

    lifecycle: Lifecycle

    async def drain(self, timeout: float) -> int:
        """Refuse new calls, wait up to ``timeout`` s; the calls still in flight."""
        ...

    async def stop(self, grace: float = 0.0) -> None:
        """Stop serving (``grace`` seconds for calls in flight) and release everything."""
        ...


#: ``(options, reuse_port) -> (started server, its description)``; ``reuse_port`` is set in a
#: worker of several, which shares the ports. Must be a module-level function (workers are
#: spawned, and get it by pickling).
Start = Callable[[argparse.Namespace, bool], Awaitable[tuple[Served, list[str]]]]


async def until_drained(server: Served, timeout: float, link: WorkerLink | None = None) -> None:
    """Wait for a signal, drain up to ``timeout`` s (a second signal cuts it short), stop."""
    signals = asyncio.Queue[int]()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM,) if link is not None else (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    if link is not None:
        link.watch(lambda: signals.put_nowait(signal.SIGTERM))
    who = f"worker {link.index} (pid {os.getpid()}) " if link is not None else ""
    received = await signals.get()
    say = logs.lifecycle().info
    say(
        "%s%s: draining %d calls in flight, at most %g s",
        who,
        signal.Signals(received).name,
        server.lifecycle.inflight,
        timeout,
    )
    drain = asyncio.ensure_future(server.drain(timeout))
    second = asyncio.ensure_future(signals.get())
    await asyncio.wait({drain, second}, return_when=asyncio.FIRST_COMPLETED)
    second.cancel()
    left = drain.result() if drain.done() else server.lifecycle.inflight
    drain.cancel()
    if left:
        say("%sstopping with %d calls still in flight (deadline or second signal)", who, left)
    await server.stop(STOP_GRACE if left else 0.0)
    say("%sstopped", who)


async def serve_until_signal(
    start: Start, args: argparse.Namespace, link: WorkerLink | None = None
) -> int:
    """Start the server, announce it (to the supervisor, in a worker), run until drained."""
    server, lines = await start(args, link is not None)
    freeze_started()
    announce(lines, link)
    await until_drained(server, args.shutdown_timeout, link)
    return 0


def freeze_started() -> None:
    """Take what a started server holds out of the cycle collector's full passes.

    What exists once a server has started (modules, tokenizers, a router's prefix index) lives
    as long as the process, yet every full collection would walk it again: a router's index
    table of 10M keys is about 0.3 s of stall each time (``router/index/memory.py``'s module
    doc). Collected first, so no garbage of the start is frozen with it. The price: an object
    of the start that later dies in a reference cycle is never reclaimed (freed by reference
    counting it still is), a bound of what existed at start, paid at most once.
    """
    gc.collect()
    gc.freeze()


def _configure_logging(args: argparse.Namespace) -> None:
    logs.configure(getattr(args, "log_level", "info"), getattr(args, "log_format", "text"))


def _worker(start: Start, args: argparse.Namespace, link: WorkerLink) -> NoReturn:
    """One worker process; the process ends once its server stopped."""
    _configure_logging(args)
    exit_stopped(asyncio.run(serve_until_signal(start, args, link)))


def run_served(
    start: Start,
    args: argparse.Namespace,
    ports: Sequence[tuple[str, str]],
    *,
    check: Callable[[argparse.Namespace], object],
) -> int:
    """Run a serving command: in this process with ``--processes 1``, else supervised workers.

    ``check`` validates the options once, before any worker starts (a bad option fails once);
    ``ports`` names the ``args`` attributes of the ports the workers share, with their option.
    """
    _configure_logging(args)
    if args.processes == 1:
        exit_stopped(asyncio.run(serve_until_signal(start, args)))  # no teardown to wait for
    check(args)
    return Supervisor(functools.partial(_worker, start), args, args.processes, ports).run()
