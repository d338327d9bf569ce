"""A one-line transfer progress bar (bytes, total, rate) for terminals; silent elsewhere."""

from __future__ import annotations

import time
from typing import TextIO

from tokenkeys.artifacts import Progress
from tokenkeys.terminal import printable

# Redraw at most this often: a fast loopback pull delivers hundreds of chunks a second.
_REDRAW_SECONDS = 0.1
_WIDTH = 24


def human_bytes(n: float) -> str:
    """``1.8 MB`` style (decimal units, as transfer rates are usually given)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


class ProgressBar:
    """Draws ``path [####----] done / total  rate`` on ``stream`` when it is a terminal.

    Call it with each :class:`~tokenkeys.artifacts.Progress`; :meth:`close` ends the line.
    ``last`` keeps the latest report, so an interrupted pull can say where it stopped.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.last: Progress | None = None
        self._started = time.monotonic()
        self._drawn = 0.0
        self._dirty = False

    def __call__(self, progress: Progress) -> None:
        self.last = progress
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._drawn >= _REDRAW_SECONDS or progress.done >= progress.total:
            self._draw(progress, now)

    def _draw(self, progress: Progress, now: float) -> None:
        fraction = progress.done / progress.total if progress.total else 1.0
        filled = int(fraction * _WIDTH)
        rate = progress.done / max(now - self._started, 1e-6)
        line = (
            f"\r{printable(progress.path)} [{'#' * filled}{'-' * (_WIDTH - filled)}] "
            f"{human_bytes(progress.done)} / {human_bytes(progress.total)}  "
            f"{human_bytes(rate)}/s"
        )
        self.stream.write(line + "\x1b[K")  # clear what a longer previous line left
        self.stream.flush()
        self._drawn = now
        self._dirty = True

    def close(self) -> None:
        """End the bar's line, if one was drawn."""
        if self._dirty:
            self.stream.write("\n")
            self.stream.flush()
            self._dirty = False
