"""Small timing helpers shared by the benchmarks (percentiles of repeated calls)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


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
