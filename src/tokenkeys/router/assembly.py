"""Assembling ``tokenkeys route``: a :class:`RouterProcessConfig` -> :class:`RouterProcess`.

The one place a router process is put together; the CLI, the tests and the benchmarks all
start it here. :meth:`RouterProcess.start` runs the steps in the only order that works:

1. the routing service: prefix index, worker registry, Router (``router/service.py``);
2. every configured worker discovered once (pools built from the first worker of each model;
   an unreachable worker is retried by the polls), then the polls started;
3. the HTTP frontend listening over the pools (leave it out with ``http_port=None`` to route
   through :meth:`RouterProcess.engine` only).

A failure at any step closes what the earlier ones opened. Shutdown: :meth:`~RouterProcess.drain`
(new requests 503, /health draining, requests in flight finish until a deadline), then
:meth:`~RouterProcess.stop` (HTTP, then the registry's polls and followers, then the index).
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenkeys.access.tls import ServerTls
from tokenkeys.frontend import HttpConfig, HttpServer
from tokenkeys.frontend.server import serve_app
from tokenkeys.router.forwarding.door import FrontDoor
from tokenkeys.router.forwarding.frontends import WorkerFrontends
from tokenkeys.router.forwarding.relay import Relay
from tokenkeys.router.frontend import RouterApp, create_router_app
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.routed_engine import RoutedEngine
from tokenkeys.router.service import RoutingConfig, RoutingService
from tokenkeys.serving.lifecycle import Lifecycle
from tokenkeys.transport.limits import ConnectionLimits


@dataclass(frozen=True)
class RouterProcessConfig:
    """What a router process is configured with.

    - ``router``: workers, policy, index, event transport, polls, pools (:class:`RoutingConfig`);
    - ``host`` / ``http_port``: where the HTTP frontend listens (0 picks a free port; None: no
      HTTP frontend);
    - ``http``: the frontend's settings (default: the pools' request limits); ``tls``: HTTPS;
    - ``reuse_port``: bind with SO_REUSEPORT (the processes of ``route --processes N`` share it);
    - ``connections``: the HTTP face's connection caps and idle timeouts.
    """

    router: RoutingConfig
    host: str = "127.0.0.1"
    http_port: int | None = None
    http: HttpConfig | None = None
    tls: ServerTls | None = None
    reuse_port: bool = False
    connections: ConnectionLimits | None = None

    def http_config(self) -> HttpConfig:
        """The frontend's settings: ``http`` when given, else the pools' limits."""
        return self.http if self.http is not None else HttpConfig(limits=self.router.pools.limits)


class RouterProcess:
    """A router process: the routing service and its HTTP frontend; see the module doc.

    ``index`` replaces the configured prefix index (tests share one between replicas).
    """

    def __init__(self, config: RouterProcessConfig, *, index: PrefixIndex | None = None) -> None:
        self.config = config
        self.service = RoutingService(config.router, index=index)
        self.lifecycle = Lifecycle()
        self.http: HttpServer | None = None
        #: The HTTP client of the front door (``router.forwarding``), once HTTP listens.
        self.relay: Relay | None = None
        #: The front door (``router.forwarding``), once HTTP listens.
        self.door: FrontDoor | None = None
        #: The HTTP app, once the HTTP face is listening.
        self.app: RouterApp | None = None

    @property
    def http_port(self) -> int:
        """The HTTP port once listening (0 without the HTTP face)."""
        return self.http.port if self.http is not None else 0

    async def start(self) -> RouterProcess:
        """Run the start steps in order; on any failure nothing stays open."""
        try:
            await self.service.start()
            if self.config.http_port is not None:
                self.http = await self._start_http(self.config.http_port)
        except BaseException:
            await self.stop()
            raise
        return self

    async def _start_http(self, port: int) -> HttpServer:
        service = self.service
        self.relay = Relay(self.config.router.pools.security)
        door = FrontDoor(
            service.router,
            service.registry,
            WorkerFrontends(service.registry.workers, self.config.router.named_frontends),
            self.relay,
            service.promises,
            service.shared,
            accuracy=service.accuracy,
            image_model_id=self.config.router.pools.images.model_id,
        )
        await door.start(self.config.router.poll_interval)
        self.door = door
        self.app = create_router_app(
            service.registry,
            service.router,
            self.config.http_config(),
            metrics=service.metrics_registry,
            lifecycle=self.lifecycle,
            shared=service.shared,
            door=door,
            explainer=service.explainer,
        )
        return await serve_app(self.app, self.config, port)

    def engine(self, model: str | None = None) -> RoutedEngine:
        """A routing engine for ``model`` (default: the first pool's)."""
        return self.service.engine(model)

    async def drain(self, timeout: float) -> int:
        """Refuse new requests, then wait up to ``timeout`` s; the requests still in flight."""
        self.lifecycle.begin_drain()
        return await self.lifecycle.wait_idle(timeout)

    async def stop(self, grace: float = 0.0) -> None:
        """Stop the HTTP frontend (``grace`` seconds for requests in flight), then routing."""
        self.lifecycle.begin_drain()
        if self.http is not None:
            await self.http.stop(grace)
            self.http = None
        if self.door is not None:
            await self.door.close()
            self.door = None
        if self.relay is not None:
            await self.relay.close()
            self.relay = None
        await self.service.close()
