"""What the registry keeps per worker address, and its views: JSON status and state gauges."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from tokenkeys._gen.openengine.v1 import openengine_pb2_grpc
from tokenkeys.engine.remote import RemoteEngine
from tokenkeys.router.ingest.consumer import ZmqEventConsumer
from tokenkeys.router.ingest.consumer_grpc import GrpcEventConsumer
from tokenkeys.router.metrics import RouterMetrics
from tokenkeys.router.workers.discovery import WorkerDescription
from tokenkeys.router.workers.pool import Pool, Refusal

if TYPE_CHECKING:  # trust.py imports this module
    from tokenkeys.router.workers.trust import Suspicion

#: A worker's states (see ``registry``).
STATES = ("ready", "refused", "down")


@dataclass
class WorkerState:
    """What the registry knows about one worker address."""

    address: str
    channel: grpc.aio.Channel
    control: openengine_pb2_grpc.ControlStub
    state: str = "down"
    instance_id: str | None = None
    description: WorkerDescription | None = None
    refusals: list[Refusal] = field(default_factory=list)
    #: The models it serves in a pool, and the forwarding engine of each.
    engines: dict[str, RemoteEngine] = field(default_factory=dict)
    consumers: dict[str, asyncio.Task] = field(default_factory=dict)
    #: The event consumer of each model (``last_seq``, ``resyncing``).
    followers: dict[str, ZmqEventConsumer | GrpcEventConsumer] = field(default_factory=dict)
    error: str | None = None
    #: GetLoad polls in a row a ready worker left unanswered before the deadline (``health``).
    missed_polls: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def as_dict(self, suspicions: dict[str, list[Suspicion]] | None = None) -> dict:
        """A JSON-ready summary (``GET /router/workers``); ``suspicions`` by model (``trust``)."""
        suspicions = suspicions or {}
        return {
            "address": self.address,
            "state": self.state,
            "instance_id": self.instance_id,
            "models": sorted(self.engines),
            "events": {
                model: {
                    "last_seq": f.last_seq,
                    "resyncing": f.resyncing,
                    "last_batch_applied_at": f.applied_at,
                    "index_writes": f.backoff.as_dict(),
                }
                for model, f in self.followers.items()
            },
            "suspect": {
                model: [{"reason": x.reason, "message": x.message} for x in found]
                for model, found in suspicions.items()
                if found
            },
            "refusals": [
                {"model": r.model, "reason": r.reason, "message": r.message} for r in self.refusals
            ],
            "error": self.error,
            "missed_polls": self.missed_polls,
        }


def pool_status(pool: Pool) -> dict:
    """A JSON-ready summary of a pool: identity, key strategy and why, block size, members."""
    return {
        "model": pool.name,
        "tokenizer_fingerprint": pool.fingerprint,
        "key_spec": {
            "profile_id": pool.key_spec.profile_id,
            "spec_fingerprint": pool.key_spec.spec_fingerprint,
        },
        "key_strategy": pool.strategy.decision.mode,
        "key_strategy_reason": pool.strategy.decision.reason,
        "block_size": pool.block_size,
        "members": sorted(pool.members),
    }


def registry_status(
    pools: dict[str, Pool],
    workers: dict[str, WorkerState],
    suspicions_of: Callable[[WorkerState], dict] | None = None,
) -> dict:
    """Pools and workers as JSON (``GET /router/workers``), each worker with its suspicions."""
    return {
        "pools": [pool_status(pool) for pool in pools.values()],
        "workers": [
            ws.as_dict(suspicions_of(ws) if suspicions_of is not None else None)
            for ws in workers.values()
        ],
    }


def count_states(
    metrics: RouterMetrics, pools: dict[str, Pool], workers: dict[str, WorkerState]
) -> None:
    """Set the ``workers{model, state}`` gauges: per pool, its workers by state."""
    for model in pools:
        counts = dict.fromkeys(STATES, 0)
        for ws in workers.values():
            if model in ws.engines:
                counts["ready"] += 1
            elif ws.description is not None and ws.description.model(model) is not None:
                counts["down" if ws.state == "down" else "refused"] += 1
        for state, count in counts.items():
            metrics.workers.labels(model, state).set(count)
