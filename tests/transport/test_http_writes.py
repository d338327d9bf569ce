"""How the bounded HTTP protocol writes an answer: a head leaves with a body written in the same
event-loop step, in one send (``transport.http_protocol._HeadWithBody``); a stream's head
leaves before its first event is produced.

How many sends an answer took is what a peer cannot see (the kernel may merge or split them), so
the send count is read from a recording transport; the stream's head is checked on a real
server and socket.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from tokenkeys.frontend import start_http_server
from tokenkeys.transport.http_protocol import _HeadWithBody
from tokenkeys.transport.limits import ConnectionLimits

from support import LoopServerThread


class _Sends:
    """A transport that records each send."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


async def test_a_head_and_a_body_of_the_same_step_leave_in_one_send() -> None:
    sends = _Sends()
    out = _HeadWithBody(sends, asyncio.get_running_loop())  # type: ignore[arg-type]
    out.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    out.write(b"{}")
    assert sends.sent == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    await asyncio.sleep(0)  # the end of the step sends nothing more
    assert len(sends.sent) == 1


async def test_a_head_alone_leaves_at_the_end_of_its_step_and_later_writes_at_once() -> None:
    sends = _Sends()
    out = _HeadWithBody(sends, asyncio.get_running_loop())  # type: ignore[arg-type]
    out.write(b"HEAD")
    assert sends.sent == []
    await asyncio.sleep(0)
    assert sends.sent == [b"HEAD"]
    out.write(b"event 1")
    out.write(b"event 2")
    assert sends.sent == [b"HEAD", b"event 1", b"event 2"]


async def test_closing_sends_a_held_head_first() -> None:
    sends = _Sends()
    out = _HeadWithBody(sends, asyncio.get_running_loop())  # type: ignore[arg-type]
    out.write(b"HEAD")
    out.close()
    assert sends.sent == [b"HEAD"] and sends.closed and out.is_closing()
    await asyncio.sleep(0)
    assert sends.sent == [b"HEAD"]


class _Stream:
    """An ASGI app whose stream sends its first event only once the test saw the head."""

    def __init__(self) -> None:
        self.head_seen = threading.Event()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await asyncio.get_running_loop().run_in_executor(None, self.head_seen.wait, 10)
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})


class _StreamServer(LoopServerThread):
    """:class:`_Stream` on the bounded protocol, as ``serve`` and ``route`` serve their apps."""

    def __init__(self) -> None:
        super().__init__()
        self.app = _Stream()
        self.head_seen = self.app.head_seen

    async def _start(self) -> tuple[Any, int]:
        server = await start_http_server(self.app, "127.0.0.1", 0, connections=ConnectionLimits())
        return server, server.port

    async def _stop(self) -> None:
        await self.server.stop(0)


def test_a_streams_head_arrives_before_its_first_event_is_produced() -> None:
    with _StreamServer() as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /events HTTP/1.1\r\nhost: test\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(65536)
            assert head.startswith(b"HTTP/1.1 200 OK") and b"data: 1" not in head
            server.head_seen.set()
            rest = b""
            while b"data: 1" not in rest:
                rest += sock.recv(65536)
