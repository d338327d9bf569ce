"""Ctrl-C while the CLI starts (its imports take seconds): recorded, never lost, then acted on.

Python's default SIGINT handler raises KeyboardInterrupt at whatever bytecode runs. Raised inside
a weakref callback or a finalizer (an import's module-lock cleanup, a garbage-collection pass)
it is printed as "Exception ignored" and dropped, and the command carries on as if no Ctrl-C had
come: a pull then ran to the end, or sat through a stalled server. So from :func:`latch`
(the first thing :func:`tokenkeys.cli.main` does) until :func:`release` the handler only records
the signal; :func:`release` gives SIGINT back to Python's handler (so that ``asyncio.run`` installs
its own, which cancels the running coroutine) and raises KeyboardInterrupt if one was recorded,
before the command starts any work. A second Ctrl-C while latched raises at once, the way
``asyncio.run`` treats a second one.

An inherited ignored SIGINT (a background job of a non-interactive shell, ``nohup``-style
launchers) is left ignored, as Unix and Python convention have it: such a job is meant to
survive the terminal's Ctrl-C.
"""

from __future__ import annotations

import signal
from types import FrameType

_recorded = False


def _record(signum: int, frame: FrameType | None) -> None:
    global _recorded
    if _recorded:
        raise KeyboardInterrupt
    _recorded = True


def latch() -> None:
    """Record Ctrl-C instead of raising it, unless SIGINT is ignored or handled by someone else."""
    global _recorded
    _recorded = False
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _record)


def unlatch() -> None:
    """Give SIGINT back to Python's default handler if :func:`latch` holds it; idempotent."""
    if signal.getsignal(signal.SIGINT) is _record:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def release() -> None:
    """:func:`unlatch`, then raise KeyboardInterrupt if a Ctrl-C came while latched."""
    global _recorded
    unlatch()
    if _recorded:
        _recorded = False
        raise KeyboardInterrupt
