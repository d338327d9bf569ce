"""Prometheus metrics of one HTTP app: a registry per app, and a middleware that wraps it.

The middleware is pure ASGI (no per-request task or body buffering, unlike Starlette's
``BaseHTTPMiddleware``), so wrapping costs a few microseconds. Routes are labelled by their
template path, never the raw URL, so unknown paths cannot grow the label set.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tokenkeys.engine.protocol import Usage
from tokenkeys.frontend.access_log import note_prompt_tokens, route_label
from tokenkeys.serving.labelled import Children

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class HttpMetrics:
    """The counters and histograms of one app, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tokenkeys_http_requests", "HTTP requests answered", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "tokenkeys_http_request_duration_seconds",
            "Time from request to the end of the response",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "tokenkeys_prompt_tokens", "Prompt tokens produced", ["model", "route"], registry=r
        )
        self.cached_tokens = Counter(
            "tokenkeys_cached_prompt_tokens",
            "Prompt tokens served from the prefix cache",
            ["model"],
            registry=r,
        )
        self.generation_tokens = Counter(
            "tokenkeys_generation_tokens", "Tokens generated", ["model"], registry=r
        )
        # With --processes N every process keeps its own counters and a scrape reaches
        # whichever worker takes the connection; the pid says whose counters these are.
        self._requests_of = Children(self.requests)
        self._latency_of = Children(self.latency)
        Gauge(
            "tokenkeys_process", "The process that answered this scrape", ["pid"], registry=r
        ).labels(str(os.getpid())).set(1)

    def record_generation(self, model: str, route: str, usages: Sequence[Usage]) -> None:
        """Count what a generation request's prompts used (its engine's usage); the same count
        goes into the request's access line."""
        prompt = sum(u.prompt_tokens for u in usages)
        note_prompt_tokens(prompt)
        self.prompt_tokens.labels(model, route).inc(prompt)
        self.cached_tokens.labels(model).inc(sum(u.cached_prompt_tokens for u in usages))
        self.generation_tokens.labels(model).inc(sum(u.completion_tokens for u in usages))

    def record(self, route: str, status: int, seconds: float) -> None:
        """Count one answered request of ``route`` (its template path, or ``unmatched``) with
        ``status``, which took ``seconds`` to the end of its body."""
        self._requests_of[(route, str(status))].inc()
        self._latency_of[(route,)].observe(seconds)

    def include(self, registry: CollectorRegistry) -> None:
        """Export another registry's metrics (router, engines) beside this app's own."""
        self.registry.register(_Include(registry))

    def render(self) -> bytes:
        """The Prometheus text exposition of this app's metrics."""
        return generate_latest(self.registry)


class _Include:
    """Collects another registry's metrics into the app's (prometheus custom collector)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
        return self._registry.collect()


class MetricsMiddleware:
    """Counts every HTTP request by route and status and times it to the end of its body."""

    def __init__(self, app: Any, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.record(route_label(scope), status, time.perf_counter() - started)
