"""The grpc core channel arguments that bound a server's connections.

gRPC has them all, under names that are easy to get wrong; this module spells them once (names
as in grpc's ``include/grpc/impl/channel_arg_names.h``, grpcio 1.85):

- ``grpc.max_allowed_incoming_connections``: the cap on open connections; grpc core refuses
  more before their handshake.
- ``grpc.max_connection_idle_ms``: a connection without calls for this long gets GOAWAY and is
  closed, which is what reclaims idle connections.
- ``grpc.max_connection_age_ms`` / ``grpc.max_connection_age_grace_ms``: a connection older
  than the age gets GOAWAY; its calls then have the grace to finish.
- ``grpc.server_handshake_timeout_ms``: a connection that does not finish its TLS and HTTP/2
  handshake in time is closed (the gRPC counterpart of the HTTP header timeout).
- keepalive enforcement: ``grpc.http2.min_ping_interval_without_data_ms`` is the shortest
  interval between client pings the server accepts, ``grpc.http2.max_ping_strikes`` how many
  faster pings end the connection (with GOAWAY ``too_many_pings``), and
  ``grpc.keepalive_permit_without_calls`` 0 makes pings without calls strikes too;
  ``grpc.keepalive_time_ms`` / ``grpc.keepalive_timeout_ms`` make the server ping connections
  with calls so a peer that vanished mid-stream is noticed.

gRPC has no per-client-address connection cap; per client it bounds streams
(``--max-streams-per-client``, :mod:`tokenkeys.server.guards`).
"""

from __future__ import annotations

from tokenkeys.transport.limits import ConnectionLimits

#: Pings faster than the allowed interval that end a connection (grpc's default is 2 as well).
PING_STRIKES = 2
#: How often the server pings a connection with calls, and how long it waits for the answer.
KEEPALIVE_TIME_MS = 120_000
KEEPALIVE_TIMEOUT_MS = 20_000


def _ms(seconds: float) -> int:
    return max(int(seconds * 1000), 1)


def grpc_server_options(limits: ConnectionLimits) -> list[tuple[str, int]]:
    """Channel arguments for ``grpc.aio.server(options=...)`` from ``limits``."""
    options = [
        ("grpc.max_allowed_incoming_connections", limits.grpc_max_connections),
        ("grpc.max_connection_idle_ms", _ms(limits.grpc_max_connection_idle)),
        ("grpc.server_handshake_timeout_ms", _ms(limits.grpc_handshake_timeout)),
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(limits.grpc_min_ping_interval)),
        ("grpc.http2.max_ping_strikes", PING_STRIKES),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ]
    if limits.grpc_max_connection_age:
        options.append(("grpc.max_connection_age_ms", _ms(limits.grpc_max_connection_age)))
        if limits.grpc_max_connection_age_grace:
            grace = _ms(limits.grpc_max_connection_age_grace)
            options.append(("grpc.max_connection_age_grace_ms", grace))
    return options
