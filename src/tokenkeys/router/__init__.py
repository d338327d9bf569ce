"""Router SDK: discover workers, follow their KV events into a prefix index, route by prefix.

Data flows one way: a worker's KV events (``tokenkeys.events``) -> a :class:`PrefixIndex`
(:class:`MemoryPrefixIndex`, or :class:`RedisPrefixIndex` shared by replicas); a prompt's block
keys (``tokenkeys.keys.block_keys`` -> :func:`prompt_keys`) -> :meth:`PrefixIndex.lookup` ->
:func:`score_workers` -> a cost per worker (prefill against load, :class:`CostWeights`) -> the
cheapest worker.

Three layers, each with its own config, one word each:

- :class:`Router`: the decision. It turns a :class:`RouteRequest` into a :class:`RouteDecision`
  by asking its :class:`Policy` (a named one, or any object with ``name``, ``choose`` and
  ``forget``) which ready worker of the request's :class:`Pool` gets it.
- :class:`RoutingService`: everything the decision needs, running: prefix index, worker
  discovery and health, event following, and the Router over the pools; configured by a
  :class:`RoutingConfig` (pools configured by :class:`PoolSettings`).
- :class:`RouterProcess`: what ``tokenkeys route`` runs: a RoutingService and the HTTP front
  door in front of it (route, then forward to the chosen worker's frontend), configured by a
  :class:`RouterProcessConfig`.

Everything else in the package is internal.
"""

from tokenkeys.router.assembly import RouterProcess, RouterProcessConfig
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.index.model import PrefixIndex, PrefixMatch, prompt_keys
from tokenkeys.router.index.redis import RedisPrefixIndex
from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.policy.decision import Policy, RouteDecision, RouteRequest
from tokenkeys.router.policy.router import Router
from tokenkeys.router.policy.scorer import WorkerScore, score_workers
from tokenkeys.router.service import RoutingConfig, RoutingService
from tokenkeys.router.workers.pool import Pool
from tokenkeys.router.workers.pool_setup import PoolSettings

__all__ = [
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
]
