"""POSTs to an app's ``direct_paths`` through :class:`DirectCycle`, on a real server and socket.

Every behaviour uvicorn's cycle has for these requests holds on the direct one: pipelining (also
mixed with requests uvicorn's cycle answers), bodies with a length or chunked, ``100 Continue``,
the client's disconnect, streams, framing, errors, keep-alive and its idle timeout, HTTP/1.0.
The app records which cycle served each request (its ``receive``'s owner).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import pytest

from tokenkeys.frontend import start_http_server
from tokenkeys.frontend.body import read_body
from tokenkeys.transport.direct_cycle import DirectCycle
from tokenkeys.transport.http_protocol import DISCONNECT
from tokenkeys.transport.limits import ConnectionLimits

from support import LoopServerThread

LIMIT = 1000


class _Request:
    """What ``read_body`` reads of a request (Starlette's ``Request`` has the same two)."""

    def __init__(self, scope: dict, receive: Any) -> None:
        self.scope = scope
        self.receive = receive


class _App:
    """POST /direct and /other: the body read as the router reads it, answered as JSON naming
    the cycle; /stream: a stream whose second event waits for the test; /fail*: errors;
    /wait: an answer held until the client leaves."""

    def __init__(self) -> None:
        self.direct_paths = frozenset(
            {"/direct", "/stream", "/fail", "/fail-late", "/bad", "/wait"}
        )
        self.release = threading.Event()
        self.left = threading.Event()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        direct = isinstance(getattr(receive, "__self__", None), DirectCycle)
        if path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"one", "more_body": True})
            await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 10)
            await send({"type": "http.response.body", "body": b"two", "more_body": False})
            return
        if path == "/fail":
            raise RuntimeError("failed before the answer")
        if path == "/fail-late":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            raise RuntimeError("failed in the middle of the answer")
        if path == "/bad":
            headers = [(b"x-split", b"a\r\nset-cookie: b")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            return
        if path == "/wait":  # two receive() calls waiting at once, and the connection's future
            assert (await receive())["type"] == "http.request"

            async def until_gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass

            await asyncio.gather(until_gone(), until_gone(), scope["extensions"][DISCONNECT])
            self.left.set()
            return
        try:
            raw = await read_body(_Request(scope, receive), LIMIT)  # type: ignore[arg-type]
            status, body = 200, {"direct": direct, "bytes": len(raw), "path": path}
        except Exception as exc:  # noqa: BLE001 - the test reads what was refused
            status, body = 413, {"error": type(exc).__name__, "direct": direct}
        data = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


class _Server(LoopServerThread):
    def __init__(self, **limits: Any) -> None:
        super().__init__()
        self.app = _App()
        self.limits = ConnectionLimits(**limits)

    async def _start(self) -> tuple[Any, int]:
        server = await start_http_server(
            self.app,
            "127.0.0.1",
            0,
            connections=self.limits,
            direct_paths=self.app.direct_paths,
        )
        return server, server.port

    async def _stop(self) -> None:
        await self.server.stop(0)


@pytest.fixture
def server() -> Any:
    with _Server(http_idle_timeout=0.5) as running:
        yield running


def _post(path: str, body: bytes = b"{}", extra: str = "", version: str = "1.1") -> bytes:
    return (
        f"POST {path} HTTP/{version}\r\nhost: t\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


class _Reader:
    """Answers read off one socket, framed by their length or chunked encoding."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        self.buf += data

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            self._more()
        part, self.buf = self.buf.split(marker, 1)
        return part

    def head(self) -> tuple[int, dict[str, str]]:
        lines = self._until(b"\r\n\r\n").decode().split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, value = line.split(":", 1)
            headers[name.lower()] = value.strip()
        return int(lines[0].split()[1]), headers

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        status, headers = self.head()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(self._until(b"\r\n"), 16)
                while len(self.buf) < size + 2:
                    self._more()
                body, self.buf = body + self.buf[:size], self.buf[size + 2 :]
                if size == 0:
                    return status, headers, body
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            self._more()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, headers, body

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def _connect(server: _Server) -> tuple[socket.socket, _Reader]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock, _Reader(sock)


def test_a_direct_path_is_served_by_the_direct_cycle_and_others_by_uvicorns(server: Any) -> None:
    sock, reader = _connect(server)
    with sock:
        for path, direct in (("/direct", True), ("/other", False), ("/direct?x=1", False)):
            sock.sendall(_post(path, b'{"a": 1}'))
            status, headers, body = reader.answer()
            assert status == 200 and json.loads(body)["direct"] is direct, path
            assert "date" in headers  # the server's default header, on both cycles
            assert json.loads(body)["bytes"] == 8


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH"])
def test_other_methods_on_a_direct_path_go_to_uvicorns_cycle(server: Any, method: str) -> None:
    sock, reader = _connect(server)
    with sock:
        sock.sendall(_post("/direct").replace(b"POST", method.encode(), 1))
        status, _, body = reader.answer()
        assert json.loads(body)["direct"] is False


def test_pipelined_requests_are_answered_in_order_across_both_cycles(server: Any) -> None:
    sock, reader = _connect(server)
    with sock:
        paths = ["/direct", "/other", "/direct", "/direct", "/other"]
        sock.sendall(b"".join(_post(p, b"{}" + b" " * i) for i, p in enumerate(paths)))
        for i, path in enumerate(paths):
            status, _, body = reader.answer()
            answer = json.loads(body)
            assert status == 200 and answer["bytes"] == 2 + i
            assert answer["direct"] is (path == "/direct")


def test_a_chunked_body_arriving_in_pieces_is_read_whole(server: Any) -> None:
    sock, reader = _connect(server)
    with sock:
        sock.sendall(
            b"POST /direct HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b'transfer-encoding: chunked\r\n\r\n3\r\n{"a\r\n'
        )
        time.sleep(0.05)
        sock.sendall(b'4\r\n": 1\r\n')
        time.sleep(0.05)
        sock.sendall(b"1\r\n}\r\n0\r\n\r\n")
        status, _, body = reader.answer()
        assert status == 200 and json.loads(body) == {"direct": True, "bytes": 8, "path": "/direct"}


def test_bodies_over_the_limit_are_refused_and_the_connection_serves_the_next(
    server: Any,
) -> None:
    sock, reader = _connect(server)
    with sock:
        big = b"x" * (LIMIT + 1)
        sock.sendall(_post("/direct", big))  # declared over the limit: refused unread
        status, _, body = reader.answer()
        assert status == 413 and json.loads(body) == {"error": "LimitExceeded", "direct": True}
        chunked = b"%x\r\n%b\r\n0\r\n\r\n" % (len(big), big)
        sock.sendall(
            b"POST /direct HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + chunked
        )
        assert reader.answer()[0] == 413  # counted as it arrived
        sock.sendall(_post("/direct"))
        status, _, body = reader.answer()
        assert status == 200 and json.loads(body)["direct"] is True


def test_100_continue_is_sent_when_the_body_is_read(server: Any) -> None:
    sock, reader = _connect(server)
    with sock:
        head = _post("/direct", b"", "expect: 100-continue\r\n").replace(
            b"content-length: 0", b"content-length: 2"
        )
        sock.sendall(head)
        assert reader.head()[0] == 100
        sock.sendall(b"{}")
        status, _, body = reader.answer()
        assert status == 200 and json.loads(body)["bytes"] == 2


def test_a_client_that_leaves_is_seen_by_the_app(server: Any) -> None:
    sock, _ = _connect(server)
    sock.sendall(_post("/wait"))
    time.sleep(0.1)
    sock.close()
    assert server.app.left.wait(10)


def test_a_stream_is_chunked_and_its_head_comes_before_its_end(server: Any) -> None:
    sock, reader = _connect(server)
    with sock:
        sock.sendall(_post("/stream"))
        status, headers = reader.head()
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        while b"one" not in reader.buf:
            reader._more()
        assert reader.buf == b"3\r\none\r\n"  # the first event, before the second is made
        server.app.release.set()
        while not reader.buf.endswith(b"0\r\n\r\n"):
            reader._more()
        assert reader.buf == b"3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n"
        reader.buf = b""
        sock.sendall(_post("/direct"))  # kept alive after the stream
        assert reader.answer()[0] == 200


def test_an_app_failing_before_its_answer_gets_500_and_a_close(server: Any) -> None:
    sock, reader = _connect(server)
    with sock:
        sock.sendall(_post("/fail"))
        status, headers, body = reader.answer()
        assert (status, headers["connection"], body) == (500, "close", b"Internal Server Error")
        assert reader.closed()


@pytest.mark.parametrize("path", ["/fail-late", "/bad"])
def test_an_answer_that_cannot_be_finished_closes_the_connection(server: Any, path: str) -> None:
    sock, reader = _connect(server)
    with sock:
        sock.sendall(_post(path))
        got = b""
        while True:
            data = sock.recv(65536)
            if not data:
                break
            got += data
        # A head may have left (/fail-late); a split header never does.
        assert b"set-cookie" not in got
        assert got == b"" or got.startswith(b"HTTP/1.1 200 OK\r\n")


def test_an_idle_connection_after_a_direct_answer_is_closed(server: Any) -> None:
    sock, reader = _connect(server)
    with sock:
        sock.sendall(_post("/direct"))
        assert reader.answer()[0] == 200
        # Closed by the idle timeout (0.5 s); the socket's own timeout (10 s) would raise.
        assert reader.closed()


def test_http_1_0_is_answered_then_closed(server: Any) -> None:
    sock, reader = _connect(server)
    with sock:
        sock.sendall(_post("/direct", version="1.0"))
        status, headers, body = reader.answer()
        assert status == 200 and headers["connection"] == "close"
        assert json.loads(body)["direct"] is True
        assert reader.closed()
