"""Prometheus metrics of every model's incremental tokenization cache, read at scrape time.

The counters live in each model's :class:`IncrementalStats` (the Preprocessor knows no
registry); this collector turns them into metric families labelled by model, so a served
model added or a router pool joined later shows up at the next scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tokenkeys.preprocess.incremental.encoder import IncrementalEncoder
from tokenkeys.preprocess.incremental.history import HistoryWatch

#: (served model name, its encoder, its history watch), one per model.
Sources = Callable[[], Iterable[tuple[str, IncrementalEncoder, HistoryWatch]]]

_COUNTERS = (
    ("hits", "tokenkeys_tokenize_cache_hits", "Texts that reused a cached prefix"),
    ("misses", "tokenkeys_tokenize_cache_misses", "Texts cut into pieces none of them cached"),
    ("reused_tokens", "tokenkeys_tokenize_cache_reused_tokens", "Token ids served from the cache"),
    ("guard_checks", "tokenkeys_tokenize_cache_guard_checks", "Spliced texts re-encoded whole"),
    (
        "guard_failures",
        "tokenkeys_tokenize_cache_guard_failures",
        "Spliced texts whose ids differed from a full encode (turns the cache off)",
    ),
)


class IncrementalCollector:
    """Collects the cache metrics of the models ``sources`` lists."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Any]:
        """The metric families (prometheus_client's collector protocol)."""
        families = {
            attr: CounterMetricFamily(name, text, labels=["model"])
            for attr, name, text in _COUNTERS
        }
        bypasses = CounterMetricFamily(
            "tokenkeys_tokenize_cache_bypasses",
            "Texts encoded whole: offsets or truncation asked for, or the cache off",
            labels=["model", "reason"],
        )
        evictions = CounterMetricFamily(
            "tokenkeys_tokenize_cache_evictions", "Pieces evicted for the budget", labels=["model"]
        )
        rewrites = CounterMetricFamily(
            "tokenkeys_chat_history_rewrites",
            "Chat renders that were no extension of the same conversation's previous render",
            labels=["model"],
        )
        size = GaugeMetricFamily(
            "tokenkeys_tokenize_cache_bytes", "Bytes the cache holds", labels=["model"]
        )
        enabled = GaugeMetricFamily(
            "tokenkeys_tokenize_cache_enabled",
            "1 when encodes go through the cache",
            labels=["model"],
        )
        for model, encoder, history in self._sources():
            stats = encoder.stats
            with stats.lock:
                for attr, family in families.items():
                    family.add_metric([model], getattr(stats, attr))
                for reason, count in sorted(stats.bypasses.items()):
                    bypasses.add_metric([model, reason], count)
            evictions.add_metric([model], encoder.cache.evictions)
            rewrites.add_metric([model], history.rewrites)
            size.add_metric([model], encoder.cache.bytes)
            enabled.add_metric([model], 1 if encoder.enabled else 0)
        yield from families.values()
        yield from (bypasses, evictions, rewrites, size, enabled)


def incremental_registry(sources: Sources) -> CollectorRegistry:
    """A registry holding only the collector of ``sources``, for an app to include."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(IncrementalCollector(sources))
    return registry
