"""One request's cycle on the paths an app serves hot, in place of uvicorn's.

uvicorn answers each request through a ``RequestResponseCycle``: an ``asyncio.Event`` per
request between the parser's callbacks and the app's ``receive()``, the answer's head checked
header by header with two regular expressions (22 searches for a forwarded answer), a head
written alone and held back by :class:`~tokenkeys.transport.http_protocol._HeadWithBody`'s
end-of-step callback. Answering the router's forwarded routes without it takes 4 % of the
router's instructions per request off (54,000 of 1.39 million; docs/benchmarks.md, "Front
door"). :class:`DirectCycle` is
the same ASGI cycle, doing only what those requests need; the protocol
(:class:`~tokenkeys.transport.http_protocol.BoundedHttpProtocol`) uses it for a POST to one of
the app's ``direct_paths`` (exactly that path, no query), and uvicorn's cycle for every other
request. The app, its ASGI messages, and what the client sees are the same:

- the same scope (uvicorn's, with :data:`~tokenkeys.transport.http_protocol.DISCONNECT`);
- ``receive()`` hands over what the parser gave (uvicorn's protocol fills ``body`` and
  ``more_body`` and wakes ``message_event`` as for its own cycle), waiting only when nothing
  is there: a body that arrived with its head costs no event; ``100 Continue`` is written on
  the first ``receive()``, reading paused above uvicorn's high-water mark and resumed here;
- a head with a ``content-length`` is held for its body and leaves with it in one write; any
  other head (a stream) leaves at the end of the event loop's step, as ``_HeadWithBody`` does;
- the server's default headers first (``date``), as uvicorn writes them;
- answer framing as uvicorn's: ``content-length`` counted (longer or shorter is an error),
  ``transfer-encoding: chunked`` encoded, a head with neither gets chunked, ``connection:
  close`` honoured, the connection closed after the answer when it is not kept alive;
- writes wait while the transport is paused (back-pressure of a slow client);
- an app that fails before its answer gets uvicorn's 500, after it the connection closed;
  both logged as uvicorn logs them.

What is not done: the two regular expressions on each header. The heads answered here are the
router's (its own ``x-tokenkeys-*`` and framing headers, and a worker's headers as httptools'
parser accepted them, which refuses control characters in names and values); what could
split an answer (a carriage return or line feed inside a name or value) is still refused, by
counting the head's line ends once. uvicorn's own access log (off in tokenkeys, which writes
its own, ``frontend.access_log``) is not written here.

Matched against uvicorn 0.55 ``uvicorn/protocols/http/httptools_impl.py``
(``RequestResponseCycle``: ``run_asgi``, ``send``, ``receive``, ``send_500_response``; the
protocol's ``on_body``/``on_message_complete``/``connection_lost`` set ``body``,
``more_body``, ``disconnected`` and ``message_event`` of the current cycle).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

log = logging.getLogger("uvicorn.error")

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ERROR_500 = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


class DirectCycle:
    """One request and its answer; see the module doc.

    The attributes uvicorn's protocol reads or sets on its current cycle keep their names:
    ``scope``, ``body``, ``more_body``, ``disconnected``, ``keep_alive``,
    ``response_complete``, ``message_event`` (this object: its :meth:`set` wakes a waiting
    ``receive()``).
    """

    __slots__ = (
        "scope",
        "body",
        "more_body",
        "disconnected",
        "keep_alive",
        "response_started",
        "response_complete",
        "message_event",
        "_transport",
        "_flow",
        "_loop",
        "_on_response",
        "_continue",
        "_waiters",
        "_default_headers",
        "_head",
        "_remaining",
        "_chunked",
        "_ended",
    )

    def __init__(
        self,
        scope: dict,
        transport: asyncio.Transport,
        flow: FlowControl,
        loop: asyncio.AbstractEventLoop,
        *,
        keep_alive: bool,
        expect_100_continue: bool,
        on_response: Callable[[], None],
        default_headers: list[tuple[bytes, bytes]],
    ) -> None:
        self.scope = scope
        self.body = bytearray()
        self.more_body = True
        self.disconnected = False
        self.keep_alive = keep_alive
        self.response_started = False
        self.response_complete = False
        self.message_event = self
        self._transport = transport
        self._flow = flow
        self._loop = loop
        self._on_response: Callable[[], None] | None = on_response
        self._continue = expect_100_continue
        self._waiters: list[asyncio.Future[None]] = []  # receive() calls waiting
        self._default_headers = default_headers  # the server's (its date)
        self._head: bytes | None = None  # a head held for its body
        self._remaining = 0  # bytes of body its content-length still announces
        self._chunked: bool | None = None
        self._ended = False  # the last part of the request body was handed over

    # -- what uvicorn's protocol calls --

    def set(self) -> None:
        """Something arrived (body, its end) or the client left: wake ``receive()``."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def run_asgi(self, app: Any) -> None:
        """Run ``app`` on this request, as uvicorn's cycle does (errors answered 500 or closed)."""
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                self._answer_500()
            else:
                self._close()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned '%s'.", result)
                self._close()
            elif not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                self._answer_500()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self._close()
        finally:
            self._on_response = None

    # -- the app's side --

    async def receive(self) -> dict:
        """The next part of the request body, or ``http.disconnect`` once the client left or
        the answer is complete."""
        if self._continue:
            self._continue = False
            if not self._transport.is_closing():
                self._transport.write(_CONTINUE)
        while not (self.disconnected or self.response_complete):
            if self.body or (not self.more_body and not self._ended):
                if self._flow.read_paused:
                    self._flow.resume_reading()
                body, self.body = bytes(self.body), bytearray()
                self._ended = not self.more_body
                return {"type": "http.request", "body": body, "more_body": self.more_body}
            if self._flow.read_paused:
                self._flow.resume_reading()
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        """Write the answer's head or a part of its body."""
        if self._flow.write_paused and not self.disconnected:
            await self._flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{kind}'."
                )
            self.response_started = True
            self._continue = False
            self._head = self._head_of(message["status"], message.get("headers", ()))
            if self._chunked:  # a stream: its head leaves at the end of this step
                self._loop.call_soon(self._flush)
            return
        if self.response_complete:
            raise RuntimeError(
                f"Unexpected ASGI message '{kind}' sent, after response already completed."
            )
        if kind != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            if len(body) > self._remaining:
                raise RuntimeError("Response content longer than Content-Length")
            self._remaining -= len(body)
            data = body
        if self._head is not None:
            data, self._head = self._head + data, None
        if data:
            self._transport.write(data)
        if not more:
            if self._remaining:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.set()
            if not self.keep_alive:
                self._transport.close()
            if self._on_response is not None:
                self._on_response()

    # -- writing --

    def _head_of(self, status: int, headers: Any) -> bytes:
        """The head's bytes; the framing it announces noted (uvicorn's rules)."""
        parts = [STATUS_LINE[status]]
        lines = 2  # the status line and the empty line
        close = False
        for name, value in (*self._default_headers, *headers):
            name = name.lower()
            if name == b"content-length" and self._chunked is None:
                self._remaining = int(value.decode())
                self._chunked = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self._remaining = 0
                self._chunked = True
            elif name == b"connection" and b"close" in [
                token.lower().strip() for token in value.split(b",")
            ]:
                self.keep_alive = False
                close = True
            parts += (name, b": ", value, b"\r\n")
            lines += 1
        if not self.keep_alive and not close:
            parts.append(b"connection: close\r\n")
            lines += 1
        if self._chunked is None and status not in (204, 304):
            self._chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
            lines += 1
        parts.append(b"\r\n")
        head = b"".join(parts)
        # A CR or LF inside a name or value would split the answer; one count finds any.
        if head.count(b"\n") != lines or head.count(b"\r") != lines:
            raise RuntimeError("Invalid HTTP header name or value.")
        return head

    def _flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def _close(self) -> None:
        self._flush()
        self._transport.close()

    def _answer_500(self) -> None:
        if not self._transport.is_closing():
            self._transport.write(_ERROR_500)
        self._transport.close()
        self.response_complete = True
