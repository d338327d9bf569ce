"""Small timing helpers shared by the benchmarks (percentiles of repeated calls)."""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def sample(fn: Callable[[], object], n: int, warmup: int = 20) -> list[float]:
    """Call ``fn`` ``warmup`` times, then ``n`` times; return each call's seconds."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) of values."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, int(q) - 1))]


def us(seconds: float) -> str:
    """Seconds as microseconds, for tables."""
    return f"{seconds * 1e6:,.0f} µs"


def fastest(fns: list[Callable[[], object]], budget: float, rounds: int = 4) -> list[float]:
    """The fastest call of each function, as timeit measures it, robust to a shared machine.

    Each function is timed back to back (warm caches, GC paused, calls under 1 ms batched so
    timer resolution never matters) for ``budget / rounds / len(fns)`` seconds, and the
    functions take turns for ``rounds`` rounds, so a burst of load from other processes cannot
    fall on one of them only. The figure is the fastest call seen.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        best = []
        for fn in fns:
            t0 = time.perf_counter()
            fn()
            best.append(time.perf_counter() - t0)
        share = budget / rounds / len(fns)
        for _ in range(rounds):
            for i, fn in enumerate(fns):
                number = max(1, int(0.001 / max(best[i], 1e-9)))
                samples = max(3, min(200, int(share / max(best[i] * number, 1e-9))))
                for _ in range(samples):
                    t0 = time.perf_counter()
                    for _ in range(number):
                        fn()
                    best[i] = min(best[i], (time.perf_counter() - t0) / number)
    finally:
        if enabled:
            gc.enable()
    return best


def load_note() -> str:
    """One line naming the machine's load average, for sections measured on shared machines."""
    one, five, _ = os.getloadavg()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"Load average when this section finished: {one:.1f} (1 min), {five:.1f} (5 min) on "
        f"{cores} cores; other processes share the machine."
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
