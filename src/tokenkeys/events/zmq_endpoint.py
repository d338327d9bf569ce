"""ZMQ endpoint strings: validating them, binding them, turning a bound socket into a routable
address.

A publisher may bind ``tcp://*:0`` or ``tcp://0.0.0.0:5557``, but what discovery advertises must
be an address a router can connect to: the real port, and a real host instead of a wildcard.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time

import zmq

from tokenkeys.errors import ConfigError

#: How long :func:`bind` waits for an address in use to be released.
BIND_WAIT_S = 1.0

_TCP = re.compile(r"tcp://(?P<host>\[[^\]]*\]|[^:/\[\]]*):(?P<port>\*|\d+)")
_WILDCARD_HOSTS = {"*", "0.0.0.0", "[::]", "::", "[*]", ""}


def check_endpoint(endpoint: str, name: str = "endpoint") -> str:
    """Return ``endpoint`` if it is a ZMQ ``tcp://host:port``, ``ipc://`` or ``inproc://`` one."""
    if endpoint.startswith(("ipc://", "inproc://")) and len(endpoint.split("://", 1)[1]) > 0:
        return endpoint
    match = _TCP.fullmatch(endpoint)
    if match is None or (match["port"] != "*" and int(match["port"]) > 65535):
        raise ConfigError(
            f"{name} {endpoint!r} is not a ZMQ endpoint; expected tcp://HOST:PORT "
            "(e.g. tcp://127.0.0.1:0 or tcp://*:5557), ipc://PATH or inproc://NAME",
            field=name,
        )
    return endpoint


def is_wildcard(endpoint: str) -> bool:
    """Whether a tcp endpoint names every interface (``*``, ``0.0.0.0``, ``::``)."""
    match = _TCP.fullmatch(endpoint)
    return match is not None and match["host"] in _WILDCARD_HOSTS


def primary_host() -> str:
    """Return this machine's outward IP address, or 127.0.0.1 when it has none.

    A UDP ``connect`` picks the interface the default route would use without sending a packet.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def routable_endpoint(bound: str, advertise_host: str | None = None) -> str:
    """Return the address to advertise for a socket bound at ``bound`` (its last_endpoint).

    A wildcard host becomes ``advertise_host`` when given, else this machine's primary address;
    ``advertise_host`` also replaces a concrete host (e.g. behind NAT).
    """
    match = _TCP.fullmatch(bound)
    if match is None:
        return bound
    host = match["host"]
    if advertise_host:
        host = advertise_host if ":" not in advertise_host else f"[{advertise_host.strip('[]')}]"
    elif host in _WILDCARD_HOSTS:
        host = primary_host()
    return f"tcp://{host}:{match['port']}"


async def bind(sock: zmq.Socket, endpoint: str, wait: float = BIND_WAIT_S) -> None:
    """Bind ``sock`` to ``endpoint``, waiting up to ``wait`` seconds while it is in use.

    ZMQ closes a socket in its I/O thread after ``close()`` returns, so a publisher opened again
    on its own port in one process (an engine restarted in place) may find the port still held
    by the socket it has just closed ("Address already in use", seen in a test run). A port that
    another socket keeps is still refused, after the wait.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.02)
