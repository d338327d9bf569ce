"""Assembling ``tokenkeys serve``: a ServeConfig and the loaded models -> :class:`EngineServer`.

The one place the serving process is put together; the CLI, the tests and the benchmarks all
start it here. :meth:`EngineServer.start` runs the steps in the only order that works, each
needing the one before:

1. cache keys attached to every model (the engines key their blocks with that spec);
2. the gRPC server listening (the KV-event topic and the advertised gRPC source name its port);
3. the HTTP frontend listening, so probes are answered while the engines start: ``/health``
   and gRPC ``Health`` say not ready with the reason (a sidecar waiting for its vLLM says what
   vLLM answered), ``/livez`` that the process is alive, every other call gets 503 /
   UNAVAILABLE with the reason (:attr:`Lifecycle.starting`, the call guards);
4. the engines started and attached to the models, all or nothing; then the server serves.

A failure at any step stops what the earlier ones started. Shutdown: :meth:`~EngineServer.drain`
(both faces refuse new calls, KV-event subscriptions end with their terminal message, calls in
flight may finish until a deadline), then :meth:`~EngineServer.stop` (servers, then engines).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from fastapi import FastAPI

from tokenkeys._gen.openengine.v1 import tokenizer_pb2_grpc
from tokenkeys.access.tls import ServerTls
from tokenkeys.access.token import BearerTokens
from tokenkeys.engine.config import EngineConfig
from tokenkeys.errors import ConfigError
from tokenkeys.frontend import HttpConfig, HttpServer, create_app
from tokenkeys.frontend.server import serve_app
from tokenkeys.keys import CacheKeySpec
from tokenkeys.limits import Limits
from tokenkeys.process import logs
from tokenkeys.server.grpc.engine_services import engine_service_adders
from tokenkeys.server.grpc.server import ServiceAdder, start_grpc_server
from tokenkeys.server.grpc.tokenizer import TokenizerService
from tokenkeys.server.http_snapshot import add_snapshot_route
from tokenkeys.server.runtime.discovery_messages import http_frontend_url
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.serving.guards import build_guards
from tokenkeys.serving.lifecycle import Lifecycle
from tokenkeys.serving.models import ModelRegistry, ServedModel, attach_cache_keys
from tokenkeys.transport.limits import ConnectionLimits


@dataclass(frozen=True)
class ServeConfig:
    """What a serving process is configured with, beside the models it serves.

    - ``host``: the address gRPC, HTTP and the KV-event sockets bind;
    - ``grpc_port`` / ``http_port``: 0 picks a free port; None leaves that face out (an engine
      runtime needs gRPC: its events are advertised under the gRPC address);
    - ``engine``: the engine settings (one kind's in ``EngineConfig.engine``); None serves the
      models' engines as they are (none, or attached by the caller) without ``Control`` and
      ``Inference`` -- a server of tokenizers only has no engine kind at all;
    - ``cache_keys``: the deployment's spec, attached to every model; ``spec_of`` overrides
      the spec an engine keys its blocks with (default: the model's cache keys, else the
      default profile);
    - ``http``: the frontend's settings (default: ``limits`` and the access settings below);
    - ``tls``, ``tokens``, ``auth_health``: TLS and bearer tokens on both faces;
    - ``reuse_port``: bind both ports with SO_REUSEPORT (the processes of ``serve --processes N``
      each build a whole server and share the ports; :mod:`tokenkeys.process.supervisor`);
    - ``connections``: connection caps and idle timeouts on both faces (default: the defaults);
    - ``vllm_engine_face``: also serve smg's ``vllm.grpc.engine.VllmEngine`` on the gRPC port
      (:mod:`tokenkeys.server.grpc.vllm_engine`; needs an engine and one model, and the ``smg``
      extra's smg-grpc-proto, or the start is refused saying so).
    """

    host: str = "127.0.0.1"
    grpc_port: int | None = 0
    http_port: int | None = None
    limits: Limits = field(default_factory=Limits)
    engine: EngineConfig | None = field(default_factory=EngineConfig)
    cache_keys: CacheKeySpec | None = None
    spec_of: Callable[[ServedModel], CacheKeySpec] | None = None
    http: HttpConfig | None = None
    tls: ServerTls | None = None
    tokens: BearerTokens | None = None
    auth_health: bool = False
    reuse_port: bool = False
    connections: ConnectionLimits | None = None
    vllm_engine_face: bool = False

    def http_config(self) -> HttpConfig:
        """The frontend's settings: ``http`` when given, else from the limits and access."""
        if self.http is not None:
            return self.http
        return HttpConfig(limits=self.limits, auth=self.tokens, auth_health=self.auth_health)


class EngineServer:
    """A serving process's gRPC server, engines and HTTP frontend; see the module doc."""

    def __init__(self, models: ModelRegistry, config: ServeConfig | None = None) -> None:
        self.models = models
        self.config = config = config or ServeConfig()
        self.lifecycle = Lifecycle()
        self.runtime: EngineRuntime | None = None
        if config.engine is not None:
            kwargs = {} if config.spec_of is None else {"spec_of": config.spec_of}
            self.runtime = EngineRuntime(models, config.engine, lifecycle=self.lifecycle, **kwargs)
        self.grpc: grpc.aio.Server | None = None
        self.grpc_port = 0
        self.http: HttpServer | None = None
        #: The HTTP app, once the HTTP face is listening.
        self.app: FastAPI | None = None

    @property
    def http_port(self) -> int:
        """The HTTP port once listening (0 without the HTTP face)."""
        return self.http.port if self.http is not None else 0

    async def start(self) -> EngineServer:
        """Run the start steps in order; on any failure nothing stays open."""
        config = self.config
        attach_cache_keys(self.models, config.cache_keys, config.limits)
        try:
            if self.runtime is not None:
                self.lifecycle.starting = "starting the engines"
            if config.grpc_port is not None:
                self.grpc, self.grpc_port = await self._start_grpc(config.grpc_port)
            if config.http_port is not None:
                self.http = await self._start_http(config.http_port)
            if self.runtime is not None:
                logs.lifecycle().info(
                    "answering health checks while the engines start (not ready until they "
                    "serve): gRPC on %s:%d, HTTP on %s:%d",
                    config.host,
                    self.grpc_port,
                    config.host,
                    self.http_port,
                )
                await self.runtime.start(config.host, self.grpc_port)
        except BaseException:
            await self.stop()
            raise
        return self

    async def _start_grpc(self, port: int) -> tuple[grpc.aio.Server, int]:
        config = self.config
        tokenizer = TokenizerService(self.models)
        adders: list[ServiceAdder] = [
            lambda s: tokenizer_pb2_grpc.add_OpenEngineTokenizerServicer_to_server(tokenizer, s)
        ]
        if self.runtime is not None:
            adders += engine_service_adders(self.models, self.runtime)
        if config.vllm_engine_face:
            adders.append(self._vllm_engine_adder())
        guards = build_guards(
            self.lifecycle, config.limits.max_streams_per_client, config.tokens, config.auth_health
        )
        return await start_grpc_server(
            adders,
            config.host,
            port,
            config.limits,
            guards=guards,
            tls=config.tls,
            reuse_port=config.reuse_port,
            connections=config.connections,
        )

    def _vllm_engine_adder(self) -> ServiceAdder:
        """smg's VllmEngine face over the runtime; ConfigError without one or without stubs."""
        if self.runtime is None:
            raise ConfigError(
                "the VllmEngine face generates, so it needs an engine", field="vllm-engine-face"
            )
        from tokenkeys.server.grpc.vllm_engine import vllm_engine_adder  # needs built stubs

        return vllm_engine_adder(self.models, self.runtime)

    async def _start_http(self, port: int) -> HttpServer:
        self.app = create_app(self.models, self.config.http_config(), lifecycle=self.lifecycle)
        if self.runtime is not None:
            self.app.state.tokenkeys.metrics.include(self.runtime.metrics)
            add_snapshot_route(self.app, self.models, self.runtime)
        server = await serve_app(self.app, self.config, port)
        if self.runtime is not None:
            self.runtime.state.http_frontend = http_frontend_url(
                self.config.host,
                server.port,
                self.runtime.state.config.advertise_host,
                self.config.tls,
            )
        return server

    def begin_drain(self) -> None:
        """Refuse new calls on both faces and end every KV-event subscription."""
        self.lifecycle.begin_drain()
        if self.runtime is not None:
            self.runtime.begin_shutdown()

    async def drain(self, timeout: float) -> int:
        """:meth:`begin_drain`, then wait up to ``timeout`` s; the calls still in flight."""
        self.begin_drain()
        return await self.lifecycle.wait_idle(timeout)

    async def stop(self, grace: float = 0.0) -> None:
        """Stop both servers (``grace`` seconds for calls in flight), then the engines."""
        self.begin_drain()
        stops = [s.stop(grace) for s in (self.http, self.grpc) if s is not None]
        await asyncio.gather(*stops)
        self.http = self.grpc = None
        if self.runtime is not None:
            await self.runtime.close()
