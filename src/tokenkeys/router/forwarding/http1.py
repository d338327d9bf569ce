"""The front door's HTTP/1.1 client: one request out, its answer read as it arrives.

Forwarding is the router's hot path, and a general HTTP client costs more per request than the
rest of the router together: ``httpx`` over ``httpcore`` and ``h11`` took about half of the
router process's CPU per forwarded request (py-spy, ``bench/bench_front_door.py``,
docs/benchmarks.md). What the relay needs is narrow: a POST (or the adapters' GET) to a known
worker, the status and headers once they arrive, then the body as it comes, with keep-alive
connections reused. So this client is an ``asyncio.Protocol`` per connection with httptools'
C response parser (the one uvicorn serves with): the request is one ``write`` of head and body,
the answer's bytes go from ``data_received`` through the parser to the reader, and a
connection goes back to its pool once its answer was read to the end and the worker keeps it
alive.

Back-pressure: a connection stops reading (``pause_reading``) while more than
:data:`READ_AHEAD` bytes of its answer wait for the reader, so a slow client slows the worker's
socket, never the router's memory. Timeouts: :data:`CONNECT_TIMEOUT` for a connection, and the
read timeout between two bytes of the answer (the caller's, the sidecar's wait for vLLM).

A pooled connection the worker closed at the moment it was reused fails without one byte of
answer; that request is sent once more on a new connection (nothing of it was answered, the
worker may have read it or not: the relay's own retry on the next worker makes the same bet).
Every other failure before the head of the answer is :class:`Unreachable`; after it, the
body's reader gets :class:`Broken`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from urllib.parse import urlsplit

import httptools

CONNECT_TIMEOUT = 5.0
#: Bytes of an answer buffered ahead of its reader before the socket stops being read.
READ_AHEAD = 1 << 16
#: Idle connections kept across all origins.
MAX_IDLE = 256

Headers = list[tuple[bytes, bytes]]


class Unreachable(Exception):
    """No head of an answer: the connection was refused, failed or timed out before it."""


class Broken(Exception):
    """The answer broke off after its head (connection lost, timeout, unparsable bytes)."""


class Reply:
    """One response: ``status`` and ``headers`` (lower-case names) once :meth:`Client.request`
    returns, then the body through :meth:`chunks` or :meth:`read`; :meth:`close` always."""

    def __init__(self, connection: _Connection, read_timeout: float) -> None:
        self.status = 0
        self.headers: Headers = []
        self._connection = connection
        self._timeout = read_timeout
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._head = False
        self._complete = False
        self._error: str | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._keep_alive = False
        self._read_until_close = False

    def header(self, name: bytes) -> bytes:
        """The first value of header ``name`` (lower case), or ``b""``."""
        for key, value in self.headers:
            if key == name:
                return value
        return b""

    def _take(self) -> bytes:
        """What arrived of the body so far, handed over (the connection reads on)."""
        chunk = b"".join(self._body) if len(self._body) > 1 else self._body[0]
        self._body.clear()
        self._buffered = 0
        self._connection.resume()
        return chunk

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (chunked encoding removed); Broken on a break."""
        while True:
            if self._body:
                yield self._take()
            elif self._complete:
                return
            elif self._error is not None:
                raise Broken(self._error)
            else:
                await self._wait()

    async def read(self) -> bytes:
        """The whole body; Broken when the worker breaks off in the middle."""
        if self._complete:
            # All of it arrived already (a small answer comes with its head): without an async
            # generator per answer.
            return self._take() if self._body else b""
        return b"".join([chunk async for chunk in self.chunks()])

    def close(self) -> None:
        """Give the connection back when the answer was read to its end and the worker keeps
        it alive; else close it (which aborts the worker's request)."""
        connection, self._connection = self._connection, None  # type: ignore[assignment]
        if connection is None:
            return
        if self._complete and self._keep_alive and not self._body:
            connection.release()
        else:
            connection.abort()

    # -- the connection's side --

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(self._timeout, self._timed_out)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _timed_out(self) -> None:
        self._fail(f"no byte from the worker for {self._timeout:g} s")
        if self._connection is not None:
            self._connection.abort()

    def _fail(self, error: str) -> None:
        if not self._complete and self._error is None:
            self._error = error
        self._wake()

    async def _await_head(self) -> None:
        while not self._head:
            if self._error is not None:
                raise Unreachable(self._error)
            await self._wait()


class _Connection(asyncio.Protocol):
    """One keep-alive connection to one origin; see the module doc."""

    def __init__(self, client: Client, origin: tuple[str, str, int]) -> None:
        self.client = client
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self.answer: Reply | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.answered_bytes = 0
        self.paused = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.answer is None or self.parser is None:  # nothing asked: not HTTP we follow
            self.abort()
            return
        self.answered_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.answer._fail(f"unparsable answer: {exc}")
            self.abort()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        answer = self.answer
        if answer is None:
            return
        if answer._head and answer._read_until_close and exc is None:
            answer._complete = True  # a body delimited by the end of the connection
            answer._wake()
        else:
            answer._fail(f"connection lost: {exc or 'closed by the worker'}")

    def pause_writing(self) -> None:  # bodies are written whole; the kernel buffers them
        pass

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.answer.headers.append((name.lower(), value))  # type: ignore[union-attr]

    def on_headers_complete(self) -> None:
        answer, parser = self.answer, self.parser
        assert answer is not None and parser is not None
        answer.status = parser.get_status_code()
        answer._keep_alive = parser.should_keep_alive()
        answer._read_until_close = not (
            answer.header(b"content-length") or answer.header(b"transfer-encoding")
        )
        answer._head = True
        answer._wake()

    def on_body(self, body: bytes) -> None:
        answer = self.answer
        assert answer is not None
        answer._body.append(body)
        answer._buffered += len(body)
        if answer._buffered > READ_AHEAD and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        answer._wake()

    def on_message_complete(self) -> None:
        answer = self.answer
        assert answer is not None
        answer._complete = True
        answer._wake()

    # the client's side
    def send(self, data: bytes, read_timeout: float) -> Reply:
        self.answer = Reply(self, read_timeout)
        self.parser = httptools.HttpResponseParser(self)
        self.answered_bytes = 0
        assert self.transport is not None
        self.transport.write(data)
        return self.answer

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.lost:
            self.paused = False
            self.transport.resume_reading()

    def release(self) -> None:
        self.answer = self.parser = None
        if self.lost or self.paused:
            self.abort()
            return
        self.client._give_back(self)

    def abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class Client:
    """Pooled HTTP/1.1 connections to the workers' frontends; see the module doc."""

    def __init__(
        self,
        read_timeout: float,
        *,
        tls: ssl.SSLContext | None = None,
        keepalive_expiry: float = 2.0,
    ) -> None:
        self.read_timeout = read_timeout
        self.keepalive_expiry = keepalive_expiry
        self._tls = tls
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._idle_count = 0
        self._origins: dict[str, tuple[tuple[str, str, int], bytes]] = {}
        self._closed = False

    async def request(
        self,
        method: bytes,
        url: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes = b"",
        *,
        read_timeout: float | None = None,
        sent: Callable[[], None] | None = None,
    ) -> Reply:
        """Send one request (``headers`` as given, names and values as bytes); the answer once
        its status and headers arrived (Unreachable before that). Cancelled while waiting: the
        connection is closed, which aborts the worker's request.

        ``sent`` is called once the request is written, before its answer is awaited: work
        that need not delay the request runs while the worker computes."""
        origin, host, target = self._split(url)
        head = [method, b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n"]
        if body or method == b"POST":
            head.append(b"content-length: %d\r\n" % len(body))
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        data = b"".join(head) + body
        timeout = self.read_timeout if read_timeout is None else read_timeout
        for attempt in (0, 1):
            connection = self._take(origin)
            reused = connection is not None
            if connection is None:
                connection = await self._connect(origin)
            answer = connection.send(data, timeout)
            try:
                if sent is not None and attempt == 0:
                    sent()
                await answer._await_head()
            except Unreachable:
                connection.abort()
                if reused and attempt == 0 and connection.answered_bytes == 0:
                    continue  # the worker closed it as it was reused; see the module doc
                raise
            except BaseException:
                connection.abort()
                raise
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Close every idle connection; connections in use close when their answer does."""
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.abort()
        self._idle.clear()
        self._idle_count = 0

    def _split(self, url: str) -> tuple[tuple[str, str, int], bytes, bytes]:
        slash = url.find("/", url.find("://") + 3)
        origin_url = url if slash < 0 else url[:slash]
        known = self._origins.get(origin_url)
        if known is None:
            parts = urlsplit(origin_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise Unreachable(f"not an http(s) URL: {url!r}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            origin = (parts.scheme, parts.hostname, port)
            known = self._origins[origin_url] = (origin, parts.netloc.encode())
        target = url[len(origin_url) :] or "/"
        return known[0], known[1], target.encode()

    def _take(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            if not connection.lost and now - connection.idle_since < self.keepalive_expiry:
                return connection
            connection.abort()
        return None

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls = None
        if scheme == "https":
            tls = self._tls if self._tls is not None else ssl.create_default_context()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self, origin),
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                ),
                CONNECT_TIMEOUT,
            )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            error = f"cannot connect to {host}:{port}: {type(exc).__name__}: {exc}"
            raise Unreachable(error) from None
        return connection

    def _give_back(self, connection: _Connection) -> None:
        if self._closed or self._idle_count >= MAX_IDLE:
            connection.abort()
            return
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.origin, []).append(connection)
        self._idle_count += 1
