"""The engines of a server: one per served model, of the kind the configuration names.

The runtime knows no engine kind: :func:`~tokenkeys.engine.registry.engine_kind` gives the
kind's factory, and the kind's hosting wraps what it builds -- :class:`StreamedHosting` when
this process streams the engines' KV events and answers ``Control`` for them (simulated, vLLM
sidecar), :class:`ForwardedHosting` when both come from the engine's own OpenEngine server
(remote). The servicers call the hosting (:class:`Hosting`) and nothing else; the hosting
receives the runtime's :class:`~tokenkeys.server.runtime.state.RuntimeState`, not the runtime.

Lifecycle: :meth:`EngineRuntime.start` after the gRPC server is listening (the topic and the
advertised gRPC source name its port); :meth:`EngineRuntime.begin_shutdown` ends every KV-event
subscription with a terminal message and refuses new requests; :meth:`EngineRuntime.close`
after the gRPC server stopped closes the sockets.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from functools import lru_cache

from prometheus_client import CollectorRegistry

from tokenkeys.engine.config import EngineConfig
from tokenkeys.engine.hosting import HostedEngine, start_progress
from tokenkeys.engine.registry import engine_kind
from tokenkeys.errors import ConfigError
from tokenkeys.events.zmq_endpoint import routable_endpoint
from tokenkeys.keys import CacheKeySpec
from tokenkeys.keys.deployment import KeySpecOptions, build_spec
from tokenkeys.server.runtime.forwarded import ForwardedHosting
from tokenkeys.server.runtime.hosting import Hosting, ModelParts
from tokenkeys.server.runtime.state import RuntimeState
from tokenkeys.server.runtime.streamed import StreamedHosting
from tokenkeys.serving.lifecycle import Lifecycle
from tokenkeys.serving.models import ModelRegistry, ServedModel

log = logging.getLogger(__name__)

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
    """Every engine of one server process; see the module doc for the lifecycle.

    Its :class:`RuntimeState` is what the hosting receives; the runtime alone changes it.
    """

    def __init__(
        self,
        models: ModelRegistry,
        config: EngineConfig,
        *,
        spec_of: Callable[[ServedModel], CacheKeySpec] = deployment_spec,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        kind = engine_kind(config.kind)
        #: Metrics of the engines (exported on the HTTP ``/metrics``), made by their kind.
        self.metrics = CollectorRegistry(auto_describe=True)
        self.state = RuntimeState(
            models,
            config,
            kind,
            spec_of,
            kind_metrics=None if kind.metrics is None else kind.metrics(self.metrics),
            lifecycle=lifecycle or Lifecycle(),
        )
        self.models = models
        self.hosting: Hosting = HOSTINGS[kind.hosting](self.state)

    @property
    def instance_id(self) -> str:
        """This process's instance id."""
        return self.state.instance_id

    @property
    def ready(self) -> bool:
        """Whether every engine started (and the runtime is not closed)."""
        return self.state.ready

    @property
    def draining(self) -> bool:
        """Whether the runtime is stopping: new requests are refused."""
        return self.state.draining

    @property
    def lifecycle(self) -> Lifecycle:
        """The process's serving state: ``starting`` says why the engines do not serve yet."""
        return self.state.lifecycle

    @property
    def grpc_address(self) -> str | None:
        """The routable ``host:port`` of this server's gRPC endpoint, known after start."""
        return self.state.grpc_address

    async def start(self, bind_host: str, grpc_port: int) -> None:
        """Build and start every model's engine; on any failure nothing stays open.

        Meanwhile ``lifecycle.starting`` says why the server does not serve yet, in the words
        of the engine that waits (:func:`~tokenkeys.engine.hosting.report_start`).
        """
        state = self.state
        state.grpc_address = routable_endpoint(
            f"tcp://{bind_host}:{grpc_port}", state.config.advertise_host
        ).removeprefix("tcp://")
        lifecycle = self.lifecycle
        lifecycle.starting = f"starting the engines ({state.kind.name})"
        token = start_progress.set(lambda reason: setattr(lifecycle, "starting", reason))
        try:
            state.config = await state.kind.prepare(state.config)
            if state.config.served_names:
                self._serve_as(state.config.served_names)
            await self.hosting.start(bind_host)
        except BaseException:
            await self.close()
            raise
        finally:
            start_progress.reset(token)
        for model in self.models:
            engine = self.hosting.parts(model.name).engine
            self.models.replace(dataclasses.replace(model, engine=engine))
        state.ready = True
        lifecycle.starting = None

    def _serve_as(self, names: tuple[str, ...]) -> None:
        """Serve the one model under the names its engine serves it under (prepare took them
        from the engine because none was given)."""
        if len(self.models.names) != 1:
            raise ConfigError(
                f"the engine serves one model as {', '.join(names)}; this server loads "
                f"{len(self.models.names)} models: name each one with --model NAME=DIR",
                field="model",
            )
        loaded = self.models.names[0]
        self.models.rename(loaded, names)
        log.info("serving %s under the engine's names: %s", loaded, ", ".join(names))

    def describe(self) -> list[str]:
        """One line per model for the server log: engine, spec and event endpoints."""
        return [f"instance id {self.instance_id}", *self.hosting.describe()]

    def engine_of(self, model: str) -> HostedEngine:
        """The engine of ``model`` (what the served model's ``engine`` is)."""
        return self.parts(model).engine

    def parts(self, model: str) -> ModelParts:
        """The engine parts of a served model (names are resolved by the model registry)."""
        return self.state.serving(self.hosting.parts, model)

    async def ensure_up(self) -> None:
        """Raise Unavailable when an engine cannot serve: discovery then finds this server
        down, and a router admits it again only once its engine answers."""
        for model in self.models.names:
            await self.parts(model).engine.ensure_up()

    def begin_shutdown(self) -> None:
        """Refuse new requests and end every KV-event subscription (terminal message)."""
        self.state.draining = True
        self.hosting.end_streams()

    async def close(self) -> None:
        """Close the engines and their sockets (idempotent)."""
        self.begin_shutdown()
        self.state.ready = False
        await self.hosting.close()
