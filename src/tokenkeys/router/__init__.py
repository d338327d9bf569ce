"""Router SDK: discover workers, follow their KV events into a prefix index, route by prefix.

Data flows one way: a worker's KV events (``tokenkeys.events``) -> :class:`EventIngestor` ->
a :class:`PrefixIndex`; a prompt's block keys (``tokenkeys.keys.block_keys`` ->
:func:`prompt_keys`) -> :meth:`PrefixIndex.lookup` -> :func:`score_workers` -> a cost per
worker (prefill against load, :class:`CostWeights`) -> the cheapest worker.
:class:`WorkerRegistry` discovers workers and keeps one pool per model (one tokenizer, one
cache-key spec); :class:`Router` turns a :class:`RouteRequest` into a :class:`RouteDecision`;
:class:`RoutingService` assembles them from a :class:`RouterConfig` (``tokenkeys route`` puts
the OpenAI HTTP frontend of ``tokenkeys.router.frontend`` in front).
"""

from tokenkeys.router.index.instrumented import InstrumentedIndex
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.index.model import PrefixIndex, PrefixMatch, index_key, prompt_keys
from tokenkeys.router.index.redis import RedisPrefixIndex
from tokenkeys.router.ingest.consumer import ZmqEventConsumer
from tokenkeys.router.ingest.consumer_grpc import GrpcEventConsumer
from tokenkeys.router.ingest.ingestor import EventIngestor, IngestMetrics
from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.policy.decision import RouteDecision, RouteRequest
from tokenkeys.router.policy.router import Router
from tokenkeys.router.policy.scorer import DEFAULT_TIER_WEIGHTS, WorkerScore, score_workers
from tokenkeys.router.service import RouterConfig, RoutingService
from tokenkeys.router.workers.pool_setup import PoolSettings
from tokenkeys.router.workers.registry import WorkerRegistry

__all__ = [
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
