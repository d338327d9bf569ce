"""Every prefix index implementation has the Protocol's methods (the pins: ``test_public_api``)."""

from __future__ import annotations

from tokenkeys.router.index.instrumented import InstrumentedIndex
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.index.redis import RedisPrefixIndex


def test_every_index_implementation_satisfies_the_protocol():
    methods = ("add", "remove", "clear", "lookup", "workers", "close")
    assert all(callable(getattr(PrefixIndex, m)) for m in methods)
    for cls in (MemoryPrefixIndex, RedisPrefixIndex, InstrumentedIndex):
        for method in methods:
            assert callable(getattr(cls, method)), (cls, method)
