"""The bounded HTTP protocol on a real uvicorn server: header cap, timeouts, connection caps."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tokenkeys.frontend import HttpConfig, create_app, start_http_server
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import load_models
from tokenkeys.tokenizer import TokenizerOptions
from tokenkeys.transport.http_protocol import ConnectionCounts
from tokenkeys.transport.limits import ConnectionLimits

from dos_support import wait_all_closed
from support import LoopServerThread


class BoundedServer(LoopServerThread):
    """The tokenkeys HTTP app (embedded model) on 127.0.0.1 with the given connection limits."""

    def __init__(self, limits: ConnectionLimits) -> None:
        super().__init__()
        self.limits = limits
        self.app = create_app(load_models([], TokenizerOptions(), Limits()), HttpConfig())

    async def _start(self) -> tuple[Any, int]:
        server = await start_http_server(self.app, "127.0.0.1", 0, connections=self.limits)
        return server, server.port

    async def _stop(self) -> None:
        await self.server.stop(0)


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[BoundedServer] = []

    def start(**limits: Any) -> BoundedServer:
        server = BoundedServer(ConnectionLimits(**limits)).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def _health(port: int, source: str = "127.0.0.1") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_a_head_over_the_cap_is_answered_431_and_closed(serve: Any) -> None:
    server = serve(http_max_header_bytes=4096)
    sock = _connect(server.port)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
    answer = _read_all(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:60]
    assert b"connection: close" in answer


def test_a_head_under_the_cap_with_its_body_in_the_same_read_is_served(serve: Any) -> None:
    server = serve(http_max_header_bytes=4096)
    body = b'{"prompt": "' + b"x" * 20000 + b'"}'
    head = (
        b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"X-Pad: " + b"p" * 3800 + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    sock = _connect(server.port)
    sock.sendall(head + body)  # one write: the server reads head and body together
    status_line = sock.recv(64)
    sock.close()
    assert status_line.startswith(b"HTTP/1.1 200 "), status_line


def test_keep_alive_requests_each_get_a_fresh_header_budget(serve: Any) -> None:
    server = serve(http_max_header_bytes=4096)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for _ in range(5):  # 5 x 3 KiB of headers on one connection: each head is under the cap
        conn.request("GET", "/health", headers={"X-Pad": "p" * 3000})
        response = conn.getresponse()
        response.read()
        assert response.status == 200
    conn.close()


def test_a_connection_that_never_finishes_its_head_is_closed(serve: Any) -> None:
    server = serve(http_header_timeout=0.5)
    silent = _connect(server.port)
    partial = _connect(server.port)
    partial.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    assert wait_all_closed([silent, partial], timeout=10) == 0
    silent.close()
    partial.close()


def test_an_idle_keep_alive_connection_is_closed(serve: Any) -> None:
    server = serve(http_idle_timeout=0.5, http_header_timeout=60)
    sock = _connect(server.port)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.recv(64).startswith(b"HTTP/1.1 200 ")
    assert wait_all_closed([sock], timeout=10) == 0
    sock.close()


def test_the_next_heads_deadline_runs_from_its_first_byte_and_replaces_the_idle_one(
    serve: Any,
) -> None:
    # One timer per connection carries both deadlines (BoundedHttpProtocol._expect): a head
    # that starts while the connection is idle is bounded by the header timeout from its first
    # byte, not by the idle timeout it interrupted; one that never ends is still closed.
    server = serve(http_idle_timeout=0.3, http_header_timeout=1.5)
    sock = _connect(server.port)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
    for _ in range(3):  # each answer then a head in two parts, across the idle deadline
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.6)
        sock.sendall(b"Host: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
    sock.sendall(b"GET /health HTTP/1.1\r\n")  # never finished: the header timeout closes it
    assert wait_all_closed([sock], timeout=10) == 0
    sock.close()


def _refused(sock: socket.socket) -> bool:
    """Whether the server answered 503 and closed before any request was sent."""
    answer = _read_all(sock)
    return answer.startswith(b"HTTP/1.1 503 ")


def _wait_until(condition: Any, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_connections_of_one_client_over_its_cap_are_refused(serve: Any) -> None:
    server = serve(http_max_connections_per_client=3)
    held = [_connect(server.port, "127.0.0.2") for _ in range(3)]
    extra = _connect(server.port, "127.0.0.2")
    assert _refused(extra)
    extra.close()
    assert _health(server.port, "127.0.0.3") == 200  # another client is not affected
    held.pop().close()  # a slot frees once the server saw the close
    assert _wait_until(lambda: _health(server.port, "127.0.0.2") == 200)
    for sock in held:
        sock.close()


def test_connections_over_the_process_cap_are_refused_until_one_closes(serve: Any) -> None:
    server = serve(http_max_connections=4, http_max_connections_per_client=0)
    held = [_connect(server.port, f"127.0.0.{2 + i}") for i in range(4)]
    extra = _connect(server.port, "127.0.0.9")
    assert _refused(extra)
    extra.close()
    held.pop().close()

    def answers() -> bool:
        try:
            return _health(server.port) == 200
        except (http.client.HTTPException, OSError):
            return False

    assert _wait_until(answers)
    for sock in held:
        sock.close()


def test_counts_per_client_are_released_to_zero() -> None:
    counts = ConnectionCounts(ConnectionLimits(http_max_connections=2))
    assert counts.admit("a") is None
    assert counts.admit("a") is None
    assert counts.admit("b") == "http_max_connections"
    counts.release("a")
    counts.release("a")
    assert counts.total == 0
    assert counts.by_client == {}
