"""Router SDK: discover workers, follow their KV events into a prefix index, route by prefix.

Data flows one way: a worker's KV events (``tokenkeys.events``) -> a :class:`PrefixIndex`
(:class:`MemoryPrefixIndex`, or :class:`RedisPrefixIndex` shared by replicas); a prompt's block
keys (``tokenkeys.keys.block_keys`` -> :func:`prompt_keys`) -> :meth:`PrefixIndex.lookup` ->
:func:`score_workers` -> a cost per worker (prefill against load, :class:`CostWeights`) -> the
cheapest worker. A :class:`Router` turns a :class:`RouteRequest` into a :class:`RouteDecision`
by asking its :class:`Policy`; :class:`RoutingService` assembles index, workers and Router from
a :class:`RouterConfig` (pools configured by :class:`PoolSettings`), and :class:`RouteServer`
is a whole router process, its OpenAI HTTP frontend included, from a :class:`RouteConfig`
(what ``tokenkeys route`` starts). Everything else in the package is internal.
"""

from tokenkeys.router.assembly import RouteConfig, RouteServer
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.index.model import PrefixIndex, PrefixMatch, prompt_keys
from tokenkeys.router.index.redis import RedisPrefixIndex
from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.policy.decision import Policy, RouteDecision, RouteRequest
from tokenkeys.router.policy.router import Router
from tokenkeys.router.policy.scorer import WorkerScore, score_workers
from tokenkeys.router.service import RouterConfig, RoutingService
from tokenkeys.router.workers.pool_setup import PoolSettings

__all__ = [
    "CostWeights",
    "MemoryPrefixIndex",
    "Policy",
    "PoolSettings",
    "PrefixIndex",
    "PrefixMatch",
    "RedisPrefixIndex",
    "RouteConfig",
    "RouteDecision",
    "RouteRequest",
    "RouteServer",
    "Router",
    "RouterConfig",
    "RoutingService",
    "WorkerScore",
    "prompt_keys",
    "score_workers",
]
