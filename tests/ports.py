"""Loopback ports for servers a test must start on a port it names beforehand.

A port from ``bind(0)`` lies in the kernel's ephemeral range, which every outgoing connection
on the machine draws its local port from: between the pick and the server's own bind, a client
socket of any process may take it ("Address already in use", seen with the ZMQ ports of engines
restarted in place while other test runs shared the machine). Below that range only another
explicit pick can collide, and picks are random.
"""

from __future__ import annotations

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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, below the ephemeral range when there is room."""
    low = _ephemeral_low()
    if low - _SPAN >= 1024:
        pick = random.SystemRandom()
        for _ in range(100):
            port = pick.randrange(low - _SPAN, low)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:  # no room below the range, or all taken: the kernel's pick
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
