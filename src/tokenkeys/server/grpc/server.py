"""Building and starting the asyncio gRPC server that hosts every tokenkeys service."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from tokenkeys.access.tls import ServerTls
from tokenkeys.errors import ConfigError
from tokenkeys.limits import Limits
from tokenkeys.server.grpc.guard import GuardInterceptor
from tokenkeys.serving.guards import Guards, build_guards
from tokenkeys.serving.lifecycle import Lifecycle
from tokenkeys.transport.grpc_options import grpc_server_options
from tokenkeys.transport.limits import ConnectionLimits

# Answers may be larger than requests (token strings and offsets of a batch); keep headroom.
_SEND_FACTOR = 4

ServiceAdder = Callable[[grpc.aio.Server], None]


async def start_grpc_server(
    adders: list[ServiceAdder],
    host: str,
    port: int,
    limits: Limits,
    *,
    guards: Guards | None = None,
    tls: ServerTls | None = None,
    reuse_port: bool = False,
    connections: ConnectionLimits | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start a server with the given services bound to ``host:port``; returns it and its port.

    ``port`` 0 picks a free port. Messages over ``limits.max_request_bytes`` are refused by gRPC
    itself with RESOURCE_EXHAUSTED naming the limit, before any of our code runs. Every call
    passes ``guards`` first (default: draining and ``limits.max_streams_per_client`` with a
    lifecycle of its own); ``tls`` serves TLS (mutual TLS with a client CA) instead of plain TCP.
    ``reuse_port`` binds with SO_REUSEPORT, so the processes of ``serve --processes N``
    share the port (the kernel spreads connections over them); off, a taken port is an error.
    ``connections`` caps connections and reclaims idle ones
    (:mod:`tokenkeys.transport.grpc_options`; default: the defaults of ConnectionLimits).
    """
    if guards is None:
        guards = build_guards(Lifecycle(), limits.max_streams_per_client)
    server = grpc.aio.server(
        interceptors=[GuardInterceptor(guards)],
        options=[
            ("grpc.max_receive_message_length", limits.max_request_bytes),
            ("grpc.max_send_message_length", limits.max_request_bytes * _SEND_FACTOR),
            ("grpc.so_reuseport", int(reuse_port)),
            *grpc_server_options(connections or ConnectionLimits()),
        ],
    )
    for add in adders:
        add(server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if tls is not None:
            bound = server.add_secure_port(address, tls.grpc_credentials())
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise ConfigError(f"cannot bind gRPC to {address}: {exc}", field="grpc-port") from exc
    if bound == 0:
        raise ConfigError(f"cannot bind gRPC to {address} (in use?)", field="grpc-port")
    await server.start()
    return server, bound
