"""Prometheus metrics of the router: decisions, workers, refusals, forwarded usage.

Ingestion (``ingest.IngestMetrics``) and index calls (``instrumented.InstrumentedIndex``) have
their own; all of them can share one ``CollectorRegistry``, which ``tokenkeys route`` exports
on ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tokenkeys.serving.labelled import Children

_SCORE_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
_SECONDS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class RouterMetrics:
    """The router's own metrics (names below, all prefixed ``tokenkeys_router_``).

    - ``decisions_total{model, policy, reason}``: routing decisions and why (``prefix``,
      ``load``, ``index_unavailable``, ``keys_unavailable``, ``keys_unverified`` (the chosen
      worker's engine publishes hashes its keys do not reproduce: routed by load),
      ``round_robin``, ``text_prefix``);
    - ``decision_score{model, policy}``: the chosen worker's score, in [0, 1];
    - ``prompt_blocks_total`` / ``matched_blocks_total{model}``: full blocks of routed prompts
      and blocks the chosen worker was expected to hold (their ratio is the expected hit rate);
    - ``route_seconds{policy}``: time to decide (keys, lookup, scoring);
    - ``requests_total{worker, outcome}``: forwarded requests (``ok``, ``failed``,
      ``retried``: the worker failed before answering and another one was tried; ``moved``:
      a replica's later copy of a new prompt, moved to a peer's worker before answering,
      ``router.replicas.reconcile``);
    - ``cached_prompt_tokens_total`` / ``prompt_tokens_total{worker}``: usage the workers
      reported for forwarded requests;
    - ``workers{model, state}``: workers by state (``ready``, ``down``, ``refused``);
    - ``workers_refused_total{model, reason}``: admissions refused, by reason (see
      ``pool.REFUSAL_REASONS``);
    - ``worker_events_total{event}``: ``joined``, ``down``, ``rejoined``, ``restarted``
      (a new engine instance at a known address), ``foreign_events`` (a rediscovery was
      triggered by events of another spec), ``keys_unverified`` (a worker began advertising
      unverified keys: routed by load from then on), ``poll_missed`` (a ready worker did not
      answer GetLoad before the deadline; down at ``down_after`` in a row);
    - ``worker_last_event_batch_timestamp_seconds{worker}``: when the last KV-event batch of a
      ready worker (``address@model``) was applied, Unix time (alert on ``time() - it``);
    - ``worker_suspect{worker, reason}``: 1 while a ready worker's reports are not believed
      (reasons in ``workers.trust``: ``load_underreported``, ``events_silent``), else 0.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "tokenkeys_router_decisions",
            "Routing decisions by policy and reason.",
            ("model", "policy", "reason"),
            registry=r,
        )
        self.score = Histogram(
            "tokenkeys_router_decision_score",
            "Score of the chosen worker.",
            ("model", "policy"),
            buckets=_SCORE_BUCKETS,
            registry=r,
        )
        self.prompt_blocks = Counter(
            "tokenkeys_router_prompt_blocks",
            "Full blocks of routed prompts.",
            ("model",),
            registry=r,
        )
        self.matched_blocks = Counter(
            "tokenkeys_router_matched_blocks",
            "Blocks the chosen worker held according to the index.",
            ("model",),
            registry=r,
        )
        self.route_seconds = Histogram(
            "tokenkeys_router_route_seconds",
            "Time to decide a route.",
            ("policy",),
            buckets=_SECONDS,
            registry=r,
        )
        self.requests = Counter(
            "tokenkeys_router_requests",
            "Requests forwarded to workers, by outcome.",
            ("worker", "outcome"),
            registry=r,
        )
        # The children the routing of every request counts with (``Children``).
        self.decisions_of = Children(self.decisions)
        self.score_of = Children(self.score)
        self.prompt_blocks_of = Children(self.prompt_blocks)
        self.matched_blocks_of = Children(self.matched_blocks)
        self.route_seconds_of = Children(self.route_seconds)
        self.requests_of = Children(self.requests)
        self.cached_tokens = Counter(
            "tokenkeys_router_cached_prompt_tokens",
            "Prompt tokens the workers served from their prefix cache.",
            ("worker",),
            registry=r,
        )
        self.prompt_tokens = Counter(
            "tokenkeys_router_prompt_tokens",
            "Prompt tokens forwarded to the workers.",
            ("worker",),
            registry=r,
        )
        self.workers = Gauge(
            "tokenkeys_router_workers",
            "Workers by state.",
            ("model", "state"),
            registry=r,
        )
        self.refused = Counter(
            "tokenkeys_router_workers_refused",
            "Worker admissions refused, by reason.",
            ("model", "reason"),
            registry=r,
        )
        self.worker_events = Counter(
            "tokenkeys_router_worker_events",
            "Worker lifecycle events.",
            ("event",),
            registry=r,
        )
        self.last_event_batch = Gauge(
            "tokenkeys_router_worker_last_event_batch_timestamp_seconds",
            "When the last KV-event batch of a ready worker was applied (Unix time).",
            ("worker",),
            registry=r,
        )
        self.suspect = Gauge(
            "tokenkeys_router_worker_suspect",
            "1 while a ready worker's reports are not believed, by reason.",
            ("worker", "reason"),
            registry=r,
        )
