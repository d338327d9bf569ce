"""The public surface of the SDK packages is pinned: changing it is a deliberate act.

Each package's ``__all__`` is the list below, every name in it resolves, and nothing else that
is not a module is reachable from the package (internals stay in their modules).
"""

from __future__ import annotations

import importlib
import inspect

import pytest

PINNED = {
    "tokenkeys.router": [
        "CostWeights",
        "MemoryPrefixIndex",
        "Policy",
        "Pool",
        "PoolSettings",
        "PrefixIndex",
        "PrefixMatch",
        "RedisPrefixIndex",
        "RouteDecision",
        "RouteRequest",
        "Router",
        "RouterProcess",
        "RouterProcessConfig",
        "RoutingConfig",
        "RoutingService",
        "WorkerScore",
        "prompt_keys",
        "score_workers",
    ],
    "tokenkeys.client": [
        "AsyncCacheKeyClient",
        "CacheKeyClient",
        "TokenizerClient",
        "strategy_from_server",
    ],
    "tokenkeys.keys": [
        "Adapter",
        "BlockKey",
        "CacheKeySpec",
        "KeyArray",
        "KeyContext",
        "KeyGroup",
        "MMItem",
        "ProfileInfo",
        "Vector",
        "block_key_array",
        "block_keys",
        "get_profile",
        "list_profiles",
        "make_spec",
    ],
}


@pytest.mark.parametrize("package", sorted(PINNED))
def test_public_names_are_pinned(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__all__ == PINNED[package]
    exposed = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert exposed == set(PINNED[package]), "internals leak from the package"
    for name in module.__all__:
        assert getattr(module, name).__doc__, f"{package}.{name} has no docstring"
