"""What the registry keeps per worker address, and the state gauges.

Its JSON views (``GET /router/workers``) are in ``status``, which also reads ``trust``: trust
judges a worker's state, so it depends on this module and not the other way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from tokenkeys._gen.openengine.v1 import openengine_pb2_grpc
from tokenkeys.engine.remote import RemoteEngine
from tokenkeys.router.ingest.consumer import ZmqEventConsumer
from tokenkeys.router.ingest.consumer_grpc import GrpcEventConsumer
from tokenkeys.router.metrics import RouterMetrics
from tokenkeys.router.workers.discovery import WorkerDescription
from tokenkeys.router.workers.pool import Pool, Refusal

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
    #: The models whose events were last followed from the engine's snapshot (``following``).
    snapshot_models: set[str] = field(default_factory=set)
    #: GetLoad polls in a row a ready worker left unanswered before the deadline (``health``).
    missed_polls: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


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
