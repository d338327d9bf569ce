"""Limits on connections, enforced before a request is read, let alone authenticated.

:class:`~tokenkeys.limits.Limits` bounds what one *request* may ask for; these bound what one
*connection* may cost before it is a request at all: header bytes, the time to send them, idle
time, and how many connections a process and one client address may hold. Each is an option of
``tokenkeys serve`` and ``tokenkeys route`` (:mod:`tokenkeys.cli.connection_options`) and a row
of docs/operating.md's limits table.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenkeys.limits import check_option_fields

#: Fields that accept 0 as "no limit" (every other field must be positive).
_ZERO_MEANS_OFF = frozenset(
    {
        "http_max_connections_per_client",
        "grpc_max_connection_age",
        "grpc_max_connection_age_grace",
    }
)


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds on one server process's connections; every field is an option with this default.

    HTTP (the uvicorn frontend of ``serve`` and ``route``):

    - ``http_max_header_bytes``: request line and headers of one request; beyond it the answer
      is 431 and the connection is closed, so nothing more of it is read or kept.
    - ``http_header_timeout``: seconds from the first byte of a request (or the connection's
      opening) to the end of its headers; a slower client is disconnected.
    - ``http_idle_timeout``: seconds a keep-alive connection may wait for its next request.
    - ``http_max_connections``: open connections of the process; more are answered 503 and
      closed at once.
    - ``http_max_connections_per_client``: open connections of one client address; 0: no
      limit (the setting behind a proxy, where every connection comes from the proxy).

    gRPC (grpc core channel arguments, :mod:`tokenkeys.transport.grpc_options`):

    - ``grpc_max_connections``: open connections of the server.
    - ``grpc_max_connection_idle``: seconds a connection without calls is kept.
    - ``grpc_max_connection_age``: seconds after which a connection is asked to go away (0: no
      limit); ``grpc_max_connection_age_grace``: then how long its calls may still finish
      (0: as long as they need, so KV-event subscriptions are never cut).
    - ``grpc_handshake_timeout``: seconds a new connection has to finish its TLS and HTTP/2
      handshake.
    - ``grpc_min_ping_interval``: the shortest interval between a client's keepalive pings
      that the server tolerates; faster pings are strikes and two strikes end the connection.
    """

    http_max_header_bytes: int = 32 * 1024
    http_header_timeout: float = 10.0
    http_idle_timeout: float = 5.0
    http_max_connections: int = 4096
    http_max_connections_per_client: int = 256
    grpc_max_connections: int = 4096
    grpc_max_connection_idle: float = 300.0
    grpc_max_connection_age: float = 3600.0
    grpc_max_connection_age_grace: float = 0.0
    grpc_handshake_timeout: float = 10.0
    grpc_min_ping_interval: float = 60.0

    def __post_init__(self) -> None:
        check_option_fields(self, _ZERO_MEANS_OFF)

    @property
    def descriptors_needed(self) -> int:
        """File descriptors both servers' caps may hold at once, before files and pipes."""
        return self.http_max_connections + self.grpc_max_connections
