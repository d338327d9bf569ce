"""Assembling a router: the index, the worker registry and the Router, from one config.

:class:`RoutingService` is what ``tokenkeys route`` runs (with the HTTP frontend of
``router.frontend`` in front) and what ``bench/bench_routing.py`` drives directly: the prefix
index (in memory, or Redis for several replicas) wrapped in its metrics, the registry that
discovers and follows the workers, and the :class:`~tokenkeys.router.policy.router.Router` over
its pools.
All metrics share one ``CollectorRegistry`` (:attr:`RoutingService.metrics_registry`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from tokenkeys.errors import ConfigError
from tokenkeys.router.explain.accuracy import Accuracy
from tokenkeys.router.explain.causes import Explainer
from tokenkeys.router.explain.removals import RemovalLog
from tokenkeys.router.explain.repair import Repair
from tokenkeys.router.forwarding.frontends import split_worker
from tokenkeys.router.forwarding.promise import PromiseMetrics
from tokenkeys.router.index.instrumented import InstrumentedIndex
from tokenkeys.router.index.memory import DEFAULT_CAPACITY, MemoryPrefixIndex
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.index.redis import RedisPrefixIndex
from tokenkeys.router.ingest.ingestor import IngestMetrics
from tokenkeys.router.metrics import RouterMetrics
from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.policy.decision import Policy
from tokenkeys.router.policy.precise import GrowthLedgers
from tokenkeys.router.policy.router import POLICIES, Router, make_policy
from tokenkeys.router.replicas import metrics as replica_metrics
from tokenkeys.router.replicas.shared_load import RedisSharedLoad
from tokenkeys.router.replicas.sharing import LocalLoad, SharedLoad
from tokenkeys.router.routed_engine import RoutedEngine
from tokenkeys.router.workers.health import DOWN_AFTER
from tokenkeys.router.workers.pool import TRANSPORTS
from tokenkeys.router.workers.pool_setup import PoolSettings, pool_factory
from tokenkeys.router.workers.registry import WorkerRegistry

INDEXES = ("memory", "redis")


@dataclass(frozen=True)
class RoutingConfig:
    """Everything a router is configured with (the ``tokenkeys route`` options).

    - ``workers``: engine gRPC addresses (``HOST:PORT``), each optionally followed by its
      OpenAI HTTP frontend when it does not advertise one (``HOST:PORT,http://HOST:PORT``,
      ``router.forwarding.frontends``);
    - ``policy``: ``precise``, ``round_robin`` or ``text_chunks`` (see ``router.policy.router``),
      or a policy object of your own (``router.policy.decision.Policy``: ``name``, ``choose``,
      ``forget``; it is used as given, one per RoutingService);
    - ``index``: ``memory`` (bounded by ``index_capacity`` block keys, LRU) or ``redis`` at
      ``redis_url`` under ``redis_namespace`` (shared by every router replica using it);
    - ``transport``: KV events over ``zmq``, ``grpc`` or ``auto`` (ZMQ when advertised);
      it overrides ``pools.transport``;
    - ``poll_interval`` / ``timeout``: seconds between worker polls (GetLoad, health,
      rejoin) and the deadline of each discovery call; ``down_after``: polls in a row a
      reachable worker may leave unanswered before it is marked down; ``retry_delay``: pause
      before a gRPC event stream is resubscribed; ``recheck_interval``: at most one
      rediscovery per this many seconds when a worker's events follow a foreign spec;
    - ``pools``: artifact cache, request limits, key strategy (``pool_setup.PoolSettings``);
    - ``cost``: the precise policy's weights and temperature (``router.policy.cost.CostWeights``);
    - ``share_load``: share requests in flight and cache growth with the other replicas
      through the Redis at ``redis_url`` (``router.replicas.shared_load``); without it each
      replica counts only its own; ``reconcile``: with it, a replica moves its later copy of a
      new prompt a peer placed elsewhere at the same instant to the peer's worker, before the
      copy's first output (``router.replicas.reconcile``).
    """

    workers: tuple[str, ...]
    policy: str | Policy = "precise"
    index: str = "memory"
    redis_url: str | None = None
    redis_namespace: str = "tokenkeys"
    index_capacity: int = DEFAULT_CAPACITY
    transport: str = "auto"
    poll_interval: float = 1.0
    timeout: float = 2.0
    down_after: int = DOWN_AFTER
    retry_delay: float = 0.5
    recheck_interval: float = 5.0
    pools: PoolSettings = field(default_factory=PoolSettings)
    cost: CostWeights = field(default_factory=CostWeights)
    share_load: bool = False
    reconcile: bool = True

    def __post_init__(self) -> None:
        if not self.workers:
            raise ConfigError("give at least one --worker HOST:PORT", field="worker")
        for spec in self.workers:
            split_worker(spec)
        if isinstance(self.policy, str) and self.policy not in POLICIES:
            raise ConfigError(
                f"--policy {self.policy!r} is not one of {', '.join(POLICIES)}", field="policy"
            )
        if not isinstance(self.policy, (str, Policy)):
            raise ConfigError(
                f"policy {self.policy!r} is neither a policy name ({', '.join(POLICIES)}) nor "
                "a Policy object (name, choose, forget)",
                field="policy",
            )
        if self.index not in INDEXES:
            raise ConfigError(
                f"--index {self.index!r} is not one of {', '.join(INDEXES)}", field="index"
            )
        if self.index == "redis" and not self.redis_url:
            raise ConfigError(
                "--index redis needs --redis-url (e.g. redis://127.0.0.1:6379/0)",
                field="redis-url",
            )
        if self.share_load and not self.redis_url:
            raise ConfigError(
                "--share-load needs --redis-url (the Redis the replicas share)",
                field="redis-url",
            )
        if self.transport not in ("auto", *TRANSPORTS):
            raise ConfigError(
                f"--events {self.transport!r} is not one of auto, {', '.join(TRANSPORTS)}",
                field="events",
            )
        if not self.poll_interval > 0 or not self.timeout > 0:
            raise ConfigError(
                f"--poll-interval and --timeout must be > 0 seconds, got {self.poll_interval} "
                f"and {self.timeout}",
                field="poll-interval",
            )
        if isinstance(self.down_after, bool) or not (
            isinstance(self.down_after, int) and self.down_after >= 1
        ):
            raise ConfigError(
                f"--down-after must be an integer >= 1 (polls), got {self.down_after!r}",
                field="down-after",
            )

    @property
    def addresses(self) -> tuple[str, ...]:
        """The workers' gRPC addresses."""
        return tuple(split_worker(spec)[0] for spec in self.workers)

    @property
    def named_frontends(self) -> dict[str, str]:
        """The HTTP frontends named with ``--worker GRPC,URL``, by gRPC address."""
        named = (split_worker(spec) for spec in self.workers)
        return {address: url for address, url in named if url is not None}

    def make_index(self) -> PrefixIndex:
        """The configured prefix index (not yet instrumented)."""
        if self.index == "redis":
            assert self.redis_url is not None
            return RedisPrefixIndex.from_url(self.redis_url, namespace=self.redis_namespace)
        return MemoryPrefixIndex(self.index_capacity)

    def make_shared_load(self) -> SharedLoad:
        """What the replicas share of their requests in flight (nothing without share_load)."""
        if self.share_load:
            assert self.redis_url is not None
            return RedisSharedLoad(
                self.redis_url, namespace=self.redis_namespace, reconcile=self.reconcile
            )
        return LocalLoad()


class RoutingService:
    """A running router: index, registry, Router; see the module doc."""

    def __init__(self, config: RoutingConfig, *, index: PrefixIndex | None = None) -> None:
        self.config = config
        self.metrics_registry = CollectorRegistry()
        self.metrics = RouterMetrics(self.metrics_registry)
        self.ingest_metrics = IngestMetrics(self.metrics_registry)
        #: Promises against answers of the forwarded requests (``router.forwarding.promise``).
        self.promises = PromiseMetrics(self.metrics_registry)
        inner = index if index is not None else config.make_index()
        #: The removals the workers' events made, kept for explanations (``router.explain``).
        self.removals = RemovalLog(inner)
        self.index = InstrumentedIndex(self.removals, registry=self.metrics_registry)
        self.registry = WorkerRegistry(
            self.index,
            pool_factory(dataclasses.replace(config.pools, transport=config.transport)),
            metrics=self.metrics,
            ingest_metrics=self.ingest_metrics,
            interval=config.poll_interval,
            timeout=config.timeout,
            down_after=config.down_after,
            retry_delay=config.retry_delay,
            foreign_interval=config.recheck_interval,
            security=config.pools.security,
        )
        #: What the replicas share of their load (``shared_load``; nothing without share_load).
        self.shared = config.make_shared_load()
        replica_metrics.register(self.shared, self.metrics_registry)
        #: The cache growth the precise policy prices, per pool; the other replicas' placements
        #: are recorded here too (``shared``, which also tells the peers this router's).
        self.growth = GrowthLedgers()
        policy = (
            make_policy(
                config.policy,
                self.index,
                cost=config.cost,
                growth=self.growth,
                placements=self.shared,
            )
            if isinstance(config.policy, str)
            else config.policy
        )
        self.router = Router(
            self.registry.pools,
            policy,
            metrics=self.metrics,
        )
        self.registry.on_leave.append(self.router.forget)
        #: Why a prompt misses the cache, per worker (``GET /router/explain``).
        self.explainer = Explainer(self.index, self.removals, self.registry.workers)
        #: Promised against served cached tokens, misses by cause (``router.explain.accuracy``).
        #: Short answers judged by the workers' events; a worker proven stale is resynced.
        self.repair = Repair(self.removals, self.registry.repair, self.metrics_registry)
        self.accuracy = Accuracy(self.explainer, self.metrics_registry, self.repair)

    async def start(self) -> RoutingService:
        """Discover every worker once (unreachable ones are retried by the polls), then poll."""
        for address in self.config.addresses:
            await self.registry.add(address)
        await self.registry.start()
        await self.shared.start(self.registry.pools, self.growth.ledger)
        return self

    def engine(self, model: str | None = None) -> RoutedEngine:
        """A routing engine for ``model`` (default: the first pool's)."""
        return RoutedEngine(
            self.router, self.registry, self.router.pool(model).name, shared=self.shared
        )

    async def close(self) -> None:
        """Stop following workers and close the index."""
        await self.shared.close()
        await self.accuracy.close()
        await self.registry.close()
        await self.index.close()
