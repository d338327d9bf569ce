"""The children a hot path counts with change exactly what ``labels()``'s children change."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tokenkeys.serving.labelled import Children, fast

_BUCKETS = (0.0, 0.001, 0.25, 1.0, 10.0)


def _metrics(registry: CollectorRegistry) -> tuple[Counter, Gauge, Histogram]:
    return (
        Counter("c", "counter", ["a"], registry=registry),
        Gauge("g", "gauge", ["a"], registry=registry),
        Histogram("h", "histogram", ["a"], buckets=_BUCKETS, registry=registry),
    )


def _exported(registry: CollectorRegistry) -> str:
    # Creation times differ between two registries; every value must not.
    return re.sub(r"^.*_created.*$", "", generate_latest(registry).decode(), flags=re.M)


amounts = st.one_of(
    st.sampled_from([*_BUCKETS, -1.0, math.inf, -math.inf, math.nan, 0.0005, 11.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-5, max_value=5),
)


@given(st.lists(st.tuples(st.sampled_from("cgh"), st.sampled_from("xy"), amounts), max_size=40))
def test_children_count_as_labels_does(ops: list[tuple[str, str, float]]) -> None:
    """The same calls through :class:`Children` and through ``labels()``: the same exposition,
    the same refusals (a counter's negative increment)."""
    mine, theirs = CollectorRegistry(), CollectorRegistry()
    fast_metrics, real_metrics = _metrics(mine), _metrics(theirs)
    children = {m._name: Children(m) for m in fast_metrics}
    for kind, label, amount in ops:
        real = dict(zip("cgh", real_metrics, strict=True))[kind].labels(label)
        child = children[dict(zip("cgh", ("c", "g", "h"), strict=True))[kind]][(label,)]
        if kind == "h":
            real.observe(amount)
            child.observe(amount)
            continue
        outcomes = []
        for target in (real, child):
            try:
                target.inc(amount)
                outcomes.append(None)
            except ValueError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
    assert _exported(mine) == _exported(theirs)


def test_a_child_laid_out_otherwise_is_used_as_it_is() -> None:
    """Values not where prometheus_client 0.x keeps them: the child's own methods count."""
    histogram = Histogram("h", "histogram", ["a"], buckets=_BUCKETS, registry=CollectorRegistry())
    child = histogram.labels("x")
    del child._sum
    assert fast(child) is child
    counter = Counter("c", "counter", ["a"], registry=CollectorRegistry()).labels("x")
    del counter._value
    assert fast(counter) is counter


def test_a_counter_refuses_a_negative_increment() -> None:
    child = Children(Counter("c", "counter", ["a"], registry=CollectorRegistry()))[("x",)]
    with pytest.raises(ValueError, match="non-negative"):
        child.inc(-1)
