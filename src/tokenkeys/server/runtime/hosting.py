"""How the server hosts the engines of one process: the interface both hostings offer.

The ``Control`` servicer answers every RPC by calling the hosting; the hosting of the kind
(:mod:`~tokenkeys.server.runtime.streamed` or :mod:`~tokenkeys.server.runtime.forwarded`)
decides whether the answer is made here or forwarded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from tokenkeys._gen.openengine.v1 import kv_pb2, lifecycle_pb2, model_pb2, server_pb2
from tokenkeys.engine.hosting import HostedEngine
from tokenkeys.events.model import EventSourceInfo
from tokenkeys.serving.models import ServedModel


class ModelParts(Protocol):
    """The running parts of one served model's engine."""

    @property
    def engine(self) -> HostedEngine:
        """The model's engine."""
        ...

    def zmq_source(self) -> EventSourceInfo | None:
        """The advertised ZMQ source of this model's events here (None: none here)."""
        ...


class Hosting(Protocol):
    """The engines of one server process, and the ``Control`` answers about them."""

    async def start(self, bind_host: str) -> None:
        """Build and start every model's engine (the runtime closes on failure)."""
        ...

    def parts(self, model: str) -> ModelParts:
        """The parts of a served model (KeyError for a model without an engine)."""
        ...

    def describe(self) -> list[str]:
        """One line per model for the server log."""
        ...

    def end_streams(self) -> None:
        """End every KV-event subscription with its terminal message."""
        ...

    async def close(self) -> None:
        """Close the engines and what serves their events (idempotent)."""
        ...

    async def server_info(self, request: server_pb2.GetServerInfoRequest) -> server_pb2.ServerInfo:
        """GetServerInfo."""
        ...

    async def model_info(
        self, model: ServedModel, request: model_pb2.GetModelInfoRequest
    ) -> model_pb2.ModelInfo:
        """GetModelInfo of ``model``."""
        ...

    async def load(self, request: server_pb2.GetLoadRequest) -> server_pb2.LoadInfo:
        """GetLoad."""
        ...

    async def health(self, request: lifecycle_pb2.HealthRequest) -> lifecycle_pb2.HealthResponse:
        """Health (the model, when named, is known)."""
        ...

    async def event_sources(
        self, names: list[str], request: kv_pb2.GetKvEventSourcesRequest
    ) -> kv_pb2.GetKvEventSourcesResponse:
        """GetKvEventSources of the models ``names``."""
        ...

    def subscribe(
        self, model: ServedModel, request: kv_pb2.SubscribeKvEventsRequest
    ) -> AsyncIterator[kv_pb2.SubscribeKvEventsResponse]:
        """SubscribeKvEvents of ``model``."""
        ...
