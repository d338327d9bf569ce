"""Serving an app with uvicorn inside the caller's event loop, beside the gRPC server.

uvicorn's ``Server.serve`` normally takes over SIGINT/SIGTERM; here the caller owns the
signals (``tokenkeys serve`` stops gRPC and HTTP together), so signal capture is switched off
and :meth:`HttpServer.stop` ends the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any, Protocol

import uvicorn

from tokenkeys.access.tls import ServerTls
from tokenkeys.errors import ConfigError
from tokenkeys.frontend.access_log import AccessLog
from tokenkeys.transport.accept_errors import throttle_accept_errors
from tokenkeys.transport.descriptors import raise_descriptor_limit
from tokenkeys.transport.http_protocol import bounded_protocol
from tokenkeys.transport.limits import ConnectionLimits

# The protocol is uvicorn's httptools one (a dependency; at 64 tokens it nearly doubles the
# /tokenize rate of the pure-Python h11 parser, bench/bench_http.py) with tokenkeys' connection
# limits on top (tokenkeys.transport.http_protocol). The event loop is the caller's, shared
# with gRPC.
# Seconds uvicorn may take to close idle keep-alive connections once the drain is done. uvicorn
# logs "ERROR: Cancel 0 running task(s), timeout graceful shutdown exceeded" whenever its wait
# times out, and with a timeout of 0 it always does (asyncio.wait_for gives a coroutine no time
# to run), so a clean stop still gets this much time; nothing is running, so it returns at once.
_CLOSE_FLOOR = 1.0


class _Embedded(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its host process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """A running HTTP server: its bound port and how to stop it."""

    def __init__(self, server: _Embedded, task: asyncio.Task, port: int) -> None:
        self._server = server
        self._task = task
        self.port = port

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let running requests finish (``grace`` seconds at most), return.

        ``tokenkeys serve`` drains before it stops (:mod:`tokenkeys.serving.lifecycle`), so by
        then nothing should be running and the grace is a backstop. Idle connections are
        closed within ``_CLOSE_FLOOR`` seconds even with ``grace`` 0, so a clean stop logs no
        timeout.
        """
        # uvicorn types it as int but only hands it to asyncio.wait_for, which takes a float.
        self._server.config.timeout_graceful_shutdown = max(grace, _CLOSE_FLOOR)  # type: ignore[assignment]
        self._server.should_exit = True
        await self._task


def _bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must be IPPROTO_TCP, not 0: asyncio only sets TCP_NODELAY on accepted sockets
    # whose proto says TCP (base_events._set_nodelay), and without it a response written as
    # head then body waits for the client's delayed ACK (~40 ms per request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind HTTP to {host}:{port}: {exc}", field="http-port") from exc
    sock.set_inheritable(True)
    return sock


async def start_http_server(
    app: Any,
    host: str,
    port: int,
    *,
    log_level: str = "warning",
    tls: ServerTls | None = None,
    reuse_port: bool = False,
    connections: ConnectionLimits | None = None,
    direct_paths: frozenset[str] = frozenset(),
) -> HttpServer:
    """Serve ``app`` on ``host:port`` (0 picks a free port) until :meth:`HttpServer.stop`.

    ``tls`` serves HTTPS (requiring client certificates when it names a client CA);
    ``reuse_port`` binds with SO_REUSEPORT so that processes share the port;
    ``connections`` bounds headers, their timeout, idle time and connection counts (default:
    :class:`~tokenkeys.transport.limits.ConnectionLimits`' defaults); POSTs to
    ``direct_paths`` skip uvicorn's per-request cycle
    (:mod:`tokenkeys.transport.direct_cycle`).
    """
    connections = connections or ConnectionLimits()
    raise_descriptor_limit(connections.descriptors_needed)
    throttle_accept_errors(asyncio.get_running_loop())
    sock = _bind(host, port, reuse_port)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        lifespan="off",
        http=bounded_protocol(connections, direct_paths),
        timeout_keep_alive=connections.http_idle_timeout,  # type: ignore[arg-type]
        log_level=log_level,
        log_config=None,  # uvicorn's loggers propagate to the process' one format
        access_log=False,
        # The client address is the connection's peer, for the streams per client as for the
        # connection caps (docs/operating.md, behind a proxy). uvicorn's default would take
        # X-Forwarded-For from a peer on 127.0.0.1, so a local client could name any address,
        # and its layer runs on every request.
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=5,
        **(tls.uvicorn_options() if tls is not None else {}),
    )
    server = _Embedded(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises what stopped the start-up
            raise ConfigError(f"HTTP server on {host}:{bound} stopped during start-up")
        await asyncio.sleep(0.005)
    return HttpServer(server, task, bound)


class Bind(Protocol):
    """Where and how a builder's faces listen (``ServeConfig``, ``RouterProcessConfig``)."""

    @property
    def host(self) -> str: ...

    @property
    def tls(self) -> ServerTls | None: ...

    @property
    def reuse_port(self) -> bool: ...

    @property
    def connections(self) -> ConnectionLimits | None: ...


async def serve_app(app: Any, bind: Bind, port: int) -> HttpServer:
    """:func:`start_http_server` of ``app`` on ``bind.host:port``, with the builder's TLS,
    port sharing and connection limits: the HTTP face of ``serve`` and ``route`` alike.

    With the app's ``access_log`` setting, the access log wraps it here, outermost, around
    everything the builder added (the router's headers name the worker it logs). An app's
    ``direct_paths`` (the router's forwarded routes) are served without uvicorn's cycle.
    """
    direct_paths = getattr(app, "direct_paths", frozenset())
    state = getattr(app.state, "tokenkeys", None)
    if state is not None and state.config.access_log:
        app = AccessLog(app)
    return await start_http_server(
        app,
        bind.host,
        port,
        tls=bind.tls,
        reuse_port=bind.reuse_port,
        connections=bind.connections,
        direct_paths=direct_paths,
    )
