"""Hostile clients for the denial-of-service tests: raw sockets, as an attacker would write them."""

from __future__ import annotations

import resource
import selectors
import socket
import time
from collections.abc import Callable

import pytest

#: The HTTP/2 client preface and an empty SETTINGS frame: enough for a gRPC server to hold the
#: connection as an established (idle) HTTP/2 connection.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def want_descriptors(count: int) -> None:
    """Raise this process's soft descriptor limit to ``count`` or skip the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= count:
        return
    if hard != resource.RLIM_INFINITY and hard < count:
        pytest.skip(f"needs {count} file descriptors; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, hard))


def host_port(address: str) -> tuple[str, int]:
    """``("127.0.0.1", 8000)`` of ``127.0.0.1:8000`` or ``http://127.0.0.1:8000``."""
    host, port = address.split("://")[-1].rsplit(":", 1)
    return host, int(port)


def open_connections(
    address: tuple[str, int], count: int, *, sources: int = 1, first: bytes = b""
) -> list[socket.socket]:
    """``count`` connected sockets spread over ``sources`` loopback addresses (127.0.0.2 on),
    each having sent ``first``."""
    socks = []
    for i in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((f"127.0.0.{2 + i % sources}", 0))
        sock.settimeout(10)
        sock.connect(address)
        if first:
            sock.sendall(first)
        socks.append(sock)
    return socks


def wait_all_closed(
    socks: list[socket.socket], timeout: float, every: Callable[[], None] | None = None
) -> int:
    """Wait until the peer closed every socket (EOF or reset); return how many are still open.

    ``every`` runs about once a second while waiting (to keep slow clients trickling, or to
    probe the server meanwhile).
    """
    sel = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
    open_ = len(socks)
    deadline = time.monotonic() + timeout
    next_tick = time.monotonic()
    try:
        while open_ and time.monotonic() < deadline:
            if every is not None and time.monotonic() >= next_tick:
                every()
                next_tick = time.monotonic() + 1.0
            for key, _ in sel.select(0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(sock)
                    open_ -= 1
    finally:
        sel.close()
    return open_


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")
