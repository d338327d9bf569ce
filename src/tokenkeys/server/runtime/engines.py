"""The engines of a server: one per served model, of the kind the configuration names.

The runtime knows no engine kind: :func:`~tokenkeys.engine.registry.engine_kind` gives the
kind's factory, and the kind's hosting wraps what it builds -- :class:`StreamedHosting` when
this process streams the engines' KV events and answers ``Control`` for them (simulated, vLLM
sidecar), :class:`ForwardedHosting` when both come from the engine's own OpenEngine server
(remote). The servicers call the hosting (:class:`Hosting`) and nothing else.

Lifecycle: :meth:`EngineRuntime.start` after the gRPC server is listening (the topic and the
advertised gRPC source name its port); :meth:`EngineRuntime.begin_shutdown` ends every KV-event
subscription with a terminal message and refuses new requests; :meth:`EngineRuntime.close`
after the gRPC server stopped closes the sockets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import lru_cache

from prometheus_client import CollectorRegistry

from tokenkeys.engine.config import EngineConfig
from tokenkeys.engine.fronted import FrontedEngine
from tokenkeys.engine.hosting import HostedEngine
from tokenkeys.engine.registry import engine_kind
from tokenkeys.errors import NotFound, Unavailable
from tokenkeys.events.zmq_endpoint import routable_endpoint
from tokenkeys.keys import CacheKeySpec
from tokenkeys.keys.deployment import KeySpecOptions, build_spec
from tokenkeys.server.runtime.forwarded import ForwardedHosting
from tokenkeys.server.runtime.hosting import Hosting, ModelParts
from tokenkeys.server.runtime.streamed import StreamedHosting
from tokenkeys.serving.models import ModelRegistry, ServedModel

#: The hosting of each kind's ``EngineKind.hosting``.
HOSTINGS: dict[str, type[StreamedHosting] | type[ForwardedHosting]] = {
    "streamed": StreamedHosting,
    "forwarded": ForwardedHosting,
}


@lru_cache(maxsize=1)
def _default_spec() -> CacheKeySpec:
    # The spec used while the server has no cache-key configuration of its own: the defaults of
    # ``tokenkeys serve --cache-key-profile`` (vLLM 0.31+ ``sha256_cbor``, the hash vLLM
    # recommends for cross-process reuse, at vLLM's default block size 16, deterministic root).
    spec = build_spec(KeySpecOptions())
    assert spec is not None
    return spec


def deployment_spec(model: ServedModel) -> CacheKeySpec:
    """The cache-key spec the engine of ``model`` keys its blocks with.

    The server's cache-key configuration (``model.cache_keys``, which carries the deployment's
    spec) when there is one, so that events, GetCacheKeySpec and ComputeCacheKeys all follow
    one spec; otherwise the defaults of ``tokenkeys serve`` (``keys.deployment``).
    """
    if model.cache_keys is not None:
        return model.cache_keys.spec
    return _default_spec()


class EngineRuntime:
    """Every engine of one server process; see the module doc for the lifecycle."""

    def __init__(
        self,
        models: ModelRegistry,
        config: EngineConfig,
        *,
        spec_of: Callable[[ServedModel], CacheKeySpec] = deployment_spec,
    ) -> None:
        self.models = models
        self.config = config
        self.spec_of = spec_of
        self.kind = engine_kind(config.kind)
        #: The routable ``host:port`` of this server's gRPC endpoint, known after start.
        self.grpc_address: str | None = None
        #: Where this server's OpenAI HTTP frontend answers (``http://host:port``), once it
        #: listens; advertised in ``ServerInfo.http_frontend`` so routers forward requests to it.
        self.http_frontend = ""
        self.ready = False
        self.draining = False
        #: Metrics of the engines (exported on the HTTP ``/metrics``), made by their kind.
        self.metrics = CollectorRegistry(auto_describe=True)
        self.kind_metrics = None if self.kind.metrics is None else self.kind.metrics(self.metrics)
        self.hosting: Hosting = HOSTINGS[self.kind.hosting](self)

    @property
    def instance_id(self) -> str:
        """This process's instance id."""
        return self.config.instance_id

    async def start(self, bind_host: str, grpc_port: int) -> None:
        """Build and start every model's engine; on any failure nothing stays open."""
        self.grpc_address = routable_endpoint(
            f"tcp://{bind_host}:{grpc_port}", self.config.advertise_host
        ).removeprefix("tcp://")
        try:
            self.config = await self.kind.prepare(self.config)
            await self.hosting.start(bind_host)
        except BaseException:
            await self.close()
            raise
        for model in self.models:
            engine = self.hosting.parts(model.name).engine
            self.models.replace(dataclasses.replace(model, engine=engine))
        self.ready = True

    def describe(self) -> list[str]:
        """One line per model for the server log: engine, spec and event endpoints."""
        return [f"instance id {self.instance_id}", *self.hosting.describe()]

    def engine_of(self, model: str) -> HostedEngine:
        """The engine of ``model`` (what the served model's ``engine`` is)."""
        return self.parts(model).engine

    def parts(self, model: str) -> ModelParts:
        """The engine parts of a served model (names are resolved by the model registry)."""
        if not self.ready or self.draining:
            raise Unavailable(
                "the engine is " + ("stopping" if self.draining else "starting") + "; retry",
                field="model",
            )
        try:
            return self.hosting.parts(model)
        except KeyError:
            raise NotFound(f"model {model!r} has no engine here", field="model") from None

    async def unready(self) -> str | None:
        """Why an engine that is a server of its own (a fronted vLLM) cannot serve now, or None."""
        for model in self.models.names:
            engine = self.parts(model).engine
            if isinstance(engine, FrontedEngine):
                reason = await engine.unready()
                if reason is not None:
                    return reason
        return None

    async def ensure_up(self) -> None:
        """Raise Unavailable when an engine cannot serve: discovery then finds this server
        down, and a router admits it again only once its engine answers."""
        for model in self.models.names:
            await self.parts(model).engine.ensure_up()

    def begin_shutdown(self) -> None:
        """Refuse new requests and end every KV-event subscription (terminal message)."""
        self.draining = True
        self.hosting.end_streams()

    async def close(self) -> None:
        """Close the engines and their sockets (idempotent)."""
        self.begin_shutdown()
        self.ready = False
        await self.hosting.close()
