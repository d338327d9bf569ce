"""Prometheus metrics around any prefix index: a wrapper, so no backend carries metrics code.

Same shape as llm-d's ``InstrumentedIndex`` (llm-d-router
``pkg/kvcache/kvblock/instrumented_index.go``): it holds the next :class:`PrefixIndex`, forwards
every call and records calls, outcomes, latency, keys and matched blocks.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Collection, Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from tokenkeys.errors import TokenkeysError
from tokenkeys.router.index.model import DEFAULT_TIER, PrefixIndex, PrefixMatch
from tokenkeys.serving.labelled import Children

T = TypeVar("T")

#: Latency buckets from 50 µs (an in-memory call) to 2.5 s (a Redis timeout).
_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5)


class InstrumentedIndex:
    """A :class:`PrefixIndex` that measures the index it wraps.

    Metrics (labels ``backend``, ``op``):

    - ``tokenkeys_router_index_requests_total{outcome}``: calls by outcome, ``ok`` or the error
      class (``Unavailable``, ``InvalidArgument``, ...; ``internal`` for anything else);
    - ``tokenkeys_router_index_request_seconds``: call latency;
    - ``tokenkeys_router_index_keys_total``: keys passed to add, remove and lookup;
    - ``tokenkeys_router_index_lookup_matched_blocks_total``: per lookup, the longest worker run
      (with ``..._keys_total{op="lookup"}`` this gives the best-case prefix hit ratio).

    ``registry`` defaults to a private one (see :attr:`registry`); pass the application's to
    export them. ``backend`` defaults to the wrapped index's ``backend`` attribute.
    """

    def __init__(
        self,
        inner: PrefixIndex,
        *,
        registry: CollectorRegistry | None = None,
        backend: str | None = None,
    ) -> None:
        self.inner = inner
        self.backend = backend or getattr(inner, "backend", type(inner).__name__)
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ("backend", "op")
        self._requests = Counter(
            "tokenkeys_router_index_requests",
            "Prefix index calls by outcome.",
            (*labels, "outcome"),
            registry=self.registry,
        )
        self._seconds = Histogram(
            "tokenkeys_router_index_request_seconds",
            "Prefix index call latency.",
            labels,
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._keys = Counter(
            "tokenkeys_router_index_keys",
            "Block keys passed to the prefix index.",
            labels,
            registry=self.registry,
        )
        self._matched = Counter(
            "tokenkeys_router_index_lookup_matched_blocks",
            "Longest consecutive run found per lookup, summed.",
            ("backend",),
            registry=self.registry,
        )
        # Every call records into these: their children kept, not looked up per call.
        self._seconds_of = Children(self._seconds)
        self._requests_of = Children(self._requests)
        self._keys_of = Children(self._keys)
        self._matched_of = Children(self._matched)

    async def _observe(self, op: str, keys: int, call: Awaitable[T]) -> T:
        started = time.perf_counter()
        outcome = "ok"
        try:
            return await call
        except TokenkeysError as exc:
            outcome = type(exc).__name__
            raise
        except Exception:
            outcome = "internal"
            raise
        finally:
            self._seconds_of[self.backend, op].observe(time.perf_counter() - started)
            self._requests_of[self.backend, op, outcome].inc()
            if keys:
                self._keys_of[self.backend, op].inc(keys)

    @staticmethod
    def _count(keys: Sequence[int]) -> int:
        try:
            return len(keys)
        except TypeError:
            return 0

    async def add(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Forwarded to the wrapped index, measured."""
        await self._observe("add", self._count(keys), self.inner.add(worker, keys, tier))

    async def remove(self, worker: str, keys: Sequence[int], tier: str = DEFAULT_TIER) -> None:
        """Forwarded to the wrapped index, measured."""
        await self._observe("remove", self._count(keys), self.inner.remove(worker, keys, tier))

    async def clear(self, worker: str) -> None:
        """Forwarded to the wrapped index, measured."""
        await self._observe("clear", 0, self.inner.clear(worker))

    async def lookup(
        self, keys: Sequence[int], workers: Collection[str] | None = None
    ) -> dict[str, PrefixMatch]:
        """Forwarded to the wrapped index, measured."""
        found = await self._observe("lookup", self._count(keys), self.inner.lookup(keys, workers))
        self._matched_of[(self.backend,)].inc(max((m.blocks for m in found.values()), default=0))
        return found

    async def workers(self) -> frozenset[str]:
        """Forwarded to the wrapped index, measured."""
        return await self._observe("workers", 0, self.inner.workers())

    async def close(self) -> None:
        """Closes the wrapped index."""
        await self.inner.close()
