"""Loopback ports for servers a test must start on a port it names beforehand.

A port from ``bind(0)`` lies in the kernel's ephemeral range, which every outgoing connection
on the machine draws its local port from: between the pick and the server's own bind, a client
socket of any process may take it ("Address already in use", seen with the ZMQ ports of engines
restarted in place while other test runs shared the machine). Below that range only another
explicit pick can collide, and two cannot: each xdist worker picks from a band of its own
(its subprocesses inherit the worker's name), and a process never hands out the same port twice
(a server picking its HTTP and gRPC ports, or a port freed and picked again while its first
owner still starts, was "Address already in use" once in a whole run). An engine restarted in
place may also find its own ports still held by the sockets ZMQ is closing: its publisher's bind
waits for them (``tokenkeys.events.zmq_endpoint.bind``).
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN = 12_000


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


#: Every port this process handed out.
_GIVEN: set[int] = set()


def _band(low: int) -> range:
    """This process's ports: the worker's share of the span below the ephemeral range."""
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % count if worker.isdigit() else 0
    width = _SPAN // count
    start = low - _SPAN + index * width
    return range(start, start + width)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now that this process never handed out before, below the
    ephemeral range when there is room."""
    low = _ephemeral_low()
    if low - _SPAN >= 1024:
        band, pick = _band(low), random.SystemRandom()
        for _ in range(100):
            port = pick.choice(band)
            if port in _GIVEN:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _GIVEN.add(port)
            return port
    with socket.socket() as sock:  # no room below the range, or all taken: the kernel's pick
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
