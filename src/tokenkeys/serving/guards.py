"""Admission checks every call passes before it runs, for HTTP and gRPC alike.

A :class:`Guard` looks at a transport-free :class:`Call` and either admits it (returning how to
release what it holds, or None) or raises the error the client gets. The gRPC interceptor
(:mod:`tokenkeys.server.grpc.guard`) and the HTTP middleware
(:mod:`tokenkeys.frontend.guard`) build the ``Call`` and translate a refusal into a status
through the one status table; the servicers and routes know nothing of them.

Guards in order: bearer-token authentication (401 / UNAUTHENTICATED), starting and draining
(503 / UNAVAILABLE, with the reason), concurrent streams per client (429 /
RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote

from tokenkeys.access.token import BearerTokens
from tokenkeys.errors import TooManyRequests, Unavailable
from tokenkeys.serving.lifecycle import Lifecycle

Release = Callable[[], None]


@dataclass(frozen=True, slots=True)
class Call:
    """What the guards know of one call.

    ``route`` is the gRPC method or HTTP path; ``client`` the peer address without its port;
    ``authorization`` the Authorization header or metadata value; ``streaming`` whether the
    call holds a stream (a gRPC server stream, an HTTP generation); ``health`` whether it is a
    health check (served while draining, and without a token unless configured otherwise).
    """

    route: str
    client: str
    authorization: str | None
    streaming: bool = False
    health: bool = False


class Guard(Protocol):
    """One admission check."""

    def admit(self, call: Call) -> Release | None:
        """Admit ``call`` (returning a release for what it holds) or raise a TokenkeysError."""
        ...


@dataclass(frozen=True)
class AuthGuard:
    """Bearer-token authentication; health checks are exempt unless ``protect_health``."""

    tokens: BearerTokens
    protect_health: bool = False

    def admit(self, call: Call) -> Release | None:
        if call.health and not self.protect_health:
            return None
        self.tokens.check(call.authorization)
        return None


@dataclass(frozen=True)
class DrainGuard:
    """Refuses new calls while the process starts (with why) or drains; counts the admitted
    ones."""

    lifecycle: Lifecycle

    def admit(self, call: Call) -> Release | None:
        if call.health:
            return None
        lifecycle = self.lifecycle
        starting = lifecycle.starting
        if starting is not None and not lifecycle.draining:
            raise Unavailable(
                f"the server is starting and does not serve yet ({call.route}): {starting}; "
                "retry once /health answers 200",
                field="server",
            )
        if lifecycle.draining:
            raise Unavailable(
                f"the server is shutting down and takes no new calls ({call.route}); retry on "
                "another instance",
                field="server",
            )
        lifecycle.enter()
        return lifecycle.leave


class StreamLimitGuard:
    """At most ``limit`` streaming calls per client address at once (0: no limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def admit(self, call: Call) -> Release | None:
        if not call.streaming or self.limit <= 0:
            return None
        client = call.client
        with self._lock:
            held = self._open.get(client, 0)
            if held >= self.limit:
                raise TooManyRequests(
                    f"client {client} already has {held} streams open; at most {self.limit} are "
                    "allowed per client (max_streams_per_client): wait for one to end, then "
                    "retry",
                    field="client",
                    limit=self.limit,
                )
            self._open[client] = held + 1

        def release() -> None:
            with self._lock:
                left = self._open[client] - 1
                if left:
                    self._open[client] = left
                else:
                    del self._open[client]

        return release

    def open_streams(self, client: str) -> int:
        """Streams ``client`` holds now."""
        return self._open.get(client, 0)


class Guards:
    """Guards applied in order; a refusal releases what earlier guards took."""

    def __init__(self, guards: Sequence[Guard]) -> None:
        self.guards = tuple(guards)

    def admit(self, call: Call) -> Release:
        """Run every guard; return one release for all of them."""
        held: list[Release] = []
        try:
            for guard in self.guards:
                release = guard.admit(call)
                if release is not None:
                    held.append(release)
        except BaseException:
            _release_all(held)
            raise
        if not held:
            return _nothing
        if len(held) == 1:
            return held[0]
        return lambda: _release_all(held)


def _nothing() -> None:
    return None


def _release_all(held: list[Release]) -> None:
    for release in reversed(held):
        release()


def build_guards(
    lifecycle: Lifecycle,
    max_streams_per_client: int,
    tokens: BearerTokens | None = None,
    protect_health: bool = False,
) -> Guards:
    """The guards of one server: authentication (if tokens), draining, streams per client."""
    guards: list[Guard] = []
    if tokens is not None:
        guards.append(AuthGuard(tokens, protect_health))
    guards.append(DrainGuard(lifecycle))
    guards.append(StreamLimitGuard(max_streams_per_client))
    return Guards(guards)


def client_of(peer: str) -> str:
    """The client address of a gRPC peer string or an HTTP client host, without the port.

    gRPC peers read ``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000`` or ``unix:/path``.
    """
    kind, sep, rest = peer.partition(":")
    if not sep:
        return peer
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        rest = unquote(rest)  # grpc writes ipv6:%5B::1%5D:5000
        host = rest.rsplit(":", 1)[0] if rest.startswith("[") else rest
        return host.strip("[]")
    return peer
