"""The router SDK's public surface is pinned: changing it is a deliberate act."""

from __future__ import annotations

import tokenkeys.router as router


def test_public_names_are_pinned():
    assert router.__all__ == [
        "DEFAULT_TIER_WEIGHTS",
        "CostWeights",
        "EventIngestor",
        "GrpcEventConsumer",
        "IngestMetrics",
        "InstrumentedIndex",
        "MemoryPrefixIndex",
        "PoolSettings",
        "PrefixIndex",
        "PrefixMatch",
        "RedisPrefixIndex",
        "RouteDecision",
        "RouteRequest",
        "Router",
        "RouterConfig",
        "RoutingService",
        "WorkerRegistry",
        "WorkerScore",
        "ZmqEventConsumer",
        "index_key",
        "prompt_keys",
        "score_workers",
    ]
    for name in router.__all__:
        assert getattr(router, name) is not None


def test_every_index_implementation_satisfies_the_protocol():
    for cls in (router.MemoryPrefixIndex, router.RedisPrefixIndex, router.InstrumentedIndex):
        for method in ("add", "remove", "clear", "lookup", "workers", "close"):
            assert callable(getattr(cls, method)), (cls, method)
