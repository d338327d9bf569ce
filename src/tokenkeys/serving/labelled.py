"""A labelled Prometheus metric's children, found once: what every hot path counts with.

The router's ingest, index and routing decisions and the HTTP frontend's requests each count
per request or per batch; ``labels()`` would cost them more than the increment itself.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

Metric = TypeVar("Metric", Counter, Gauge, Histogram)


class Children(dict[tuple[str, ...], Metric], Generic[Metric]):
    """A labelled metric's children by their label values, ``labels()`` called once for each.

    ``labels()`` takes the metric's lock and builds its key on every call, which costs a hot
    path (ingest: once per batch) more than the increment itself. Exact by construction: a child
    is created on its first use, when ``labels()`` would have created it (so the exported series
    are the same), and is the one ``labels()`` returns as long as the metric's children are not
    removed. None of the router's or the HTTP frontend's are; code that ever prunes a series
    (``remove()``, ``clear()``) must drop its entry here too.
    """

    __slots__ = ("metric",)

    def __init__(self, metric: Metric) -> None:
        super().__init__()
        self.metric = metric

    def __missing__(self, labels: tuple[str, ...]) -> Metric:
        child = self[labels] = self.metric.labels(*labels)
        return child
