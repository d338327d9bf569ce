"""Connection limits of ``tokenkeys serve`` and ``tokenkeys route`` (``--http-*``, ``--grpc-*``)."""

from __future__ import annotations

import argparse
from dataclasses import fields

from tokenkeys.transport.limits import ConnectionLimits

_HELP = {
    "http_max_header_bytes": "bytes of one request's line and headers; beyond: 431 and close",
    "http_header_timeout": "seconds a client has to send a request's headers; then closed",
    "http_idle_timeout": "seconds a keep-alive connection may wait for its next request",
    "http_max_connections": "open HTTP connections of the process; more: 503 and close",
    "http_max_connections_per_client": "open HTTP connections of one client address; more: 503 "
    "and close; 0: no limit (behind a proxy)",
    "grpc_max_connections": "open gRPC connections; more are refused",
    "grpc_max_connection_idle": "seconds a gRPC connection without calls is kept",
    "grpc_max_connection_age": "seconds after which a gRPC connection is asked to go away; 0: "
    "never",
    "grpc_max_connection_age_grace": "seconds its calls may then take; 0: as long as needed",
    "grpc_handshake_timeout": "seconds a gRPC connection has to finish its TLS/HTTP2 handshake",
    "grpc_min_ping_interval": "shortest interval between a client's keepalive pings; faster "
    "pings end the connection",
}


def add_connection_options(parser: argparse.ArgumentParser, *, grpc: bool = True) -> None:
    """Register the connection limits (the gRPC ones only where a gRPC server runs)."""
    g = parser.add_argument_group(
        "connection limits (before a request is read; see docs/operating.md, denial of service)"
    )
    for f in fields(ConnectionLimits):
        if f.name.startswith("grpc_") and not grpc:
            continue
        kind = int if isinstance(f.default, int) else float
        g.add_argument(
            "--" + f.name.replace("_", "-"),
            type=kind,
            default=f.default,
            metavar="N" if kind is int else "SECONDS",
            help=f"{_HELP[f.name]} (default {f.default:g})",
        )


def connection_limits_from(args: argparse.Namespace) -> ConnectionLimits:
    """The connection limits of parsed arguments (defaults for options a command lacks)."""
    names = [f.name for f in fields(ConnectionLimits)]
    given = {name: getattr(args, name) for name in names if hasattr(args, name)}
    return ConnectionLimits(**given)
