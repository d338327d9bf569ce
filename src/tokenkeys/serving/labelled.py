"""A labelled Prometheus metric's children, found once: what every hot path counts with.

The router's ingest, index and routing decisions and the HTTP frontend's requests each count
per request or per batch; ``labels()`` would cost them more than the increment itself, and a
child's own ``inc()``/``observe()`` checks, on every call, what holds for every child (that it
has its labels) before it takes its value's lock.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

Metric = TypeVar("Metric", Counter, Gauge, Histogram)


class Children(dict[tuple[str, ...], Any], Generic[Metric]):
    """A labelled metric's children by their label values, ``labels()`` called once for each;
    each answers ``inc()`` (counters, gauges) or ``observe()`` (histograms).

    ``labels()`` takes the metric's lock and builds its key on every call, which costs a hot
    path (ingest: once per batch) more than the increment itself. Exact by construction: a child
    is created on its first use, when ``labels()`` would have created it (so the exported series
    are the same), and is the one ``labels()`` returns as long as the metric's children are not
    removed. None of the router's or the HTTP frontend's are; code that ever prunes a series
    (``remove()``, ``clear()``) must drop its entry here too. What is stored is :func:`fast`'s
    face of the child, which changes the same values.
    """

    __slots__ = ("metric",)

    def __init__(self, metric: Metric) -> None:
        super().__init__()
        self.metric = metric

    def __missing__(self, labels: tuple[str, ...]) -> Any:
        child = self[labels] = fast(self.metric.labels(*labels))
        return child


class _Increment:
    """A counter's or gauge's child, incremented as its ``inc()`` does (no exemplar)."""

    __slots__ = ("_value", "_counter")

    def __init__(self, value: Any, counter: bool) -> None:
        self._value = value
        self._counter = counter

    def inc(self, amount: float = 1) -> None:
        """Add ``amount`` (a counter refuses a negative one, as prometheus_client does)."""
        if self._counter and amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._value.inc(amount)


class _Observe:
    """A histogram's child, observed as its ``observe()`` does (no exemplar): the sum, then
    the first bucket whose upper bound is at least the amount (none for NaN)."""

    __slots__ = ("_sum", "_buckets", "_bounds")

    def __init__(self, total: Any, buckets: list[Any], bounds: list[float]) -> None:
        self._sum = total
        self._buckets = buckets
        self._bounds = bounds

    def observe(self, amount: float) -> None:
        """Count ``amount``."""
        self._sum.inc(amount)
        if amount == amount:  # NaN is in no bucket (every comparison with it is false)
            self._buckets[bisect_left(self._bounds, amount)].inc(1)


def fast(child: Any) -> Any:
    """``child`` (of a Counter, Gauge or Histogram) with an ``inc`` or ``observe`` that writes
    its values directly: the same lock and the same values as its own methods, without their
    per-call checks. A child whose values are not laid out as prometheus_client 0.x lays them
    out (``_value``; ``_sum``, ``_buckets`` and ``_upper_bounds``) is returned as it is."""
    if isinstance(child, Histogram):
        parts = [getattr(child, name, None) for name in ("_sum", "_buckets", "_upper_bounds")]
        if None not in parts and len(parts[1]) == len(parts[2]) and parts[2][-1] == float("inf"):
            return _Observe(*parts)
        return child
    value = getattr(child, "_value", None)
    if value is None or not isinstance(child, (Counter, Gauge)):
        return child
    return _Increment(value, isinstance(child, Counter))
