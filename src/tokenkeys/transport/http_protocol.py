"""uvicorn's httptools protocol with the connection limits applied before a request is read.

uvicorn bounds none of what arrives before a request reaches the app: httptools keeps every
header line in memory however long, a connection that never finishes its headers is never timed
out (the keep-alive timer is armed only after a response), and connections are unlimited
(``limit_concurrency`` answers 503 only once the headers were read). :class:`BoundedHttpProtocol`
adds, per connection:

- a cap on the bytes of a request's line and headers, counted as they arrive and before the
  parser buffers them: beyond it 431 and close, so the rest is never read and nothing is kept;
- a header timeout from the connection's opening (or the first byte of a later request) to the
  end of the headers;
- caps on the open connections of the process and of one client address, refused with a fixed
  503 and closed as they are accepted, before any byte is read.

And one change of how an answer is written: uvicorn writes a response's head as soon as the app
starts it and its body with the next message, two sends even when the body follows at once
(a whole JSON answer). Each send to a loopback peer wakes it, and with two sends the client
wakes for a head without its body (bench_front_door: a third of the router's busy time was
its socket writes). :class:`_HeadWithBody` holds the head until the end of the event loop's
step, so a body written in the same step leaves in the same send; a stream's head still leaves
at once (within that step), its events as they come.

And one path around uvicorn's per-request cycle: a POST to one of the app's ``direct_paths``
(the router's forwarded routes) is answered through
:class:`~tokenkeys.transport.direct_cycle.DirectCycle`, the same ASGI cycle without its
per-request event and header checks (that module's doc); every other request through uvicorn's.

And one ASGI extension: every request's ``scope["extensions"]`` holds :data:`DISCONNECT`, a
future done once the client's connection is lost, so an app that waits on something else (the
router waiting for a worker) notices a client that left without a task of its own reading
``receive()`` (``router.forwarding.client_side``).

The idle keep-alive timeout is uvicorn's own ``timeout_keep_alive``, set from the same limits by
:func:`tokenkeys.frontend.server.start_http_server`.

Matched against uvicorn 0.54 ``uvicorn/protocols/http/httptools_impl.py`` (``HttpToolsProtocol``:
``connection_made``/``connection_lost``, ``data_received`` feeding the parser, the parser
callbacks ``on_headers_complete``/``on_message_complete``, ``cycle.response_complete``); those
hooks have had the same shape since uvicorn 0.30, the oldest version pyproject allows.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_remote_addr

from tokenkeys.transport.direct_cycle import DirectCycle
from tokenkeys.transport.limits import ConnectionLimits
from tokenkeys.transport.throttled_log import ThrottledLog

log = logging.getLogger("tokenkeys.transport")

# The end of a request head; llhttp also accepts bare line feeds.
_HEAD_ENDS = (b"\r\n\r\n", b"\n\n")


def _plain_answer(status: str, text: str) -> bytes:
    """A complete HTTP/1.1 answer that closes the connection (written without the app)."""
    body = text.encode("ascii")
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode("ascii") + body


#: The ASGI extension naming the future of the client's connection; see the module doc.
DISCONNECT = "tokenkeys.disconnect"

_TOO_MANY = _plain_answer("503 Service Unavailable", "too many connections; retry later\n")
_HEAD_TOO_LARGE = _plain_answer(
    "431 Request Header Fields Too Large", "the request line and headers are too large\n"
)


class ConnectionCounts:
    """Open connections of one server, in all and per client address."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.total = 0
        self.by_client: dict[str, int] = {}

    def admit(self, client: str) -> str | None:
        """Count a new connection from ``client``, or return the name of the cap it exceeds."""
        if self.total >= self.limits.http_max_connections:
            return "http_max_connections"
        held = self.by_client.get(client, 0)
        per_client = self.limits.http_max_connections_per_client
        if per_client and held >= per_client:
            return "http_max_connections_per_client"
        self.total += 1
        self.by_client[client] = held + 1
        return None

    def release(self, client: str) -> None:
        """Forget one connection of ``client``."""
        self.total -= 1
        held = self.by_client.get(client, 0) - 1
        if held > 0:
            self.by_client[client] = held
        else:
            self.by_client.pop(client, None)


def _head_ends_within(tail: bytes, data: bytes, allowed: int) -> bool:
    """Whether the head ends within the first ``allowed`` bytes of ``data``.

    ``tail`` is the end of what was already received of the head, so a marker split between two
    reads is found.
    """
    window = tail + data[: max(allowed, 0)]
    return any(end in window for end in _HEAD_ENDS)


class _HeadWithBody:
    """The transport as one response's cycle sees it; see the module doc."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._first = True
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._first:  # the head (or a 100 Continue): held until the end of this step
            self._first = False
            self._head = data
            self._loop.call_soon(self._flush)
            return
        if self._head is not None:
            data, self._head = self._head + data, None
        self._transport.write(data)

    def _flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


class BoundedHttpProtocol(HttpToolsProtocol):
    """One HTTP/1.1 connection, bounded as :mod:`this module <tokenkeys.transport.http_protocol>`
    describes. Made per server by :func:`bounded_protocol`, which sets the class attributes."""

    limits: ClassVar[ConnectionLimits]
    counts: ClassVar[ConnectionCounts]
    notices: ClassVar[ThrottledLog]
    #: The paths whose POSTs a :class:`DirectCycle` answers (request targets, as bytes).
    direct_paths: ClassVar[frozenset[bytes]] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client: str | None = None  # set once the connection is counted
        self._in_head = True
        self._head_bytes = 0
        self._head_tail = b""
        # The connection's one timer (see _expect): what it waits for, and until when.
        self._waiting_for = ""  # "head", "idle" or nothing
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._lost: asyncio.Future[None] | None = None  # DISCONNECT, once a request asked

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        remote = get_remote_addr(transport)
        client = remote[0] if remote else ""
        refusal = self.counts.admit(client)
        if refusal is not None:
            # Refused before uvicorn sees it: no parser state, no task, one write.
            self.notices.note(
                refusal, f"HTTP connection from {client or 'a local socket'} refused ({refusal})"
            )
            transport.write(_TOO_MANY)
            transport.close()
            return
        self._client = client
        super().connection_made(transport)
        self._expect("head", self.limits.http_header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._client is None:
            return  # refused in connection_made: uvicorn never tracked it
        self.counts.release(self._client)
        self._client = None
        self._waiting_for = ""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            if self._waiting_for != "head":
                self._expect("head", self.limits.http_header_timeout)
            allowed = self.limits.http_max_header_bytes - self._head_bytes
            if len(data) > allowed and not _head_ends_within(self._head_tail, data, allowed):
                self._refuse_head()
                return
            self._head_bytes += len(data)
            self._head_tail = data[-3:]
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._head_tail = b""
        self._stop_waiting("head")
        if self.url in self.direct_paths and self._direct():
            return
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not before:  # a request to answer
            self.cycle.transport = _HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
            self.cycle.scope.setdefault("extensions", {})[DISCONNECT] = self._lost_future()

    def _lost_future(self) -> asyncio.Future[None]:
        if self._lost is None:
            self._lost = self.loop.create_future()
        return self._lost

    def _direct(self) -> bool:
        """Answer this request through a :class:`DirectCycle` when it may be (a POST to a
        direct path, exactly, no upgrade, no concurrency limit); False leaves it to uvicorn.

        The scope is completed as uvicorn's ``on_headers_complete`` completes it; a target
        equal to a direct path has no query, no escapes and no fragment to parse.
        """
        parser = self.parser
        if (
            parser.get_method() != b"POST"
            or parser.should_upgrade()
            or self.limit_concurrency is not None
        ):
            return False
        version = parser.get_http_version()
        scope = self.scope
        scope["method"] = "POST"
        if version != "1.1":
            scope["http_version"] = version
        scope["path"] = self.root_path + self.url.decode("ascii")
        scope["raw_path"] = self.root_path.encode("ascii") + self.url
        scope["query_string"] = b""
        scope["extensions"] = {DISCONNECT: self._lost_future()}  # type: ignore[typeddict-unknown-key]
        cycle = DirectCycle(
            scope,  # type: ignore[arg-type]
            self.transport,
            self.flow,
            self.loop,
            keep_alive=version != "1.0" and parser.should_keep_alive(),
            expect_100_continue=self.expect_100_continue,
            on_response=self.on_response_complete,
            default_headers=self.server_state.default_headers,
        )
        existing, self.cycle = self.cycle, cycle  # type: ignore[assignment]
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, self.app)  # type: ignore[arg-type]
        else:  # pipelined behind an answer still being written: uvicorn's queue
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))  # type: ignore[arg-type]
        return True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # what arrives next is the head of the next request

    def _refuse_head(self) -> None:
        self.notices.note(
            "http_max_header_bytes",
            f"HTTP request head from {self._client or 'a local socket'} over "
            f"{self.limits.http_max_header_bytes} bytes: answered 431 and closed",
        )
        self.transport.pause_reading()
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_HEAD_TOO_LARGE)
        # else: an answer is being written on this connection; a 431 would interleave with it.
        self.transport.close()

    def on_response_complete(self) -> None:
        """uvicorn's, with its keep-alive timer as the idle deadline of :meth:`_expect`."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self._waiting_for != "head":
            # A next head already arriving keeps its header deadline, which bounds it (uvicorn
            # would also run its keep-alive timer from here, closing the head mid-way).
            self._expect("idle", self.timeout_keep_alive)

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls it as data arrives and as the connection ends.
        self._stop_waiting("idle")
        super()._unset_keepalive_if_required()

    def _expect(self, what: str, seconds: float) -> None:
        """Close the connection unless ``what`` ("head": the end of a request head, "idle":
        the next request) comes within ``seconds``.

        One timer per connection, moved lazily: each request sets a deadline, and the timer,
        when it fires early, re-arms itself for the deadline now due. A ``call_later`` and its
        cancel per wait (two waits a request) were a few thousand instructions a request, and
        left cancelled handles in the event loop's heap.
        """
        deadline = self.loop.time() + seconds
        self._waiting_for, self._deadline = what, deadline
        if self._timer is None or self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self.loop.call_at(deadline, self._timer_fired)

    def _stop_waiting(self, what: str) -> None:
        if self._waiting_for == what:
            self._waiting_for = ""

    def _timer_fired(self) -> None:
        self._timer = None
        if not self._waiting_for:
            return
        if self._deadline > self.loop.time():  # moved on since the timer was set
            self._timer_at = self._deadline
            self._timer = self.loop.call_at(self._deadline, self._timer_fired)
            return
        what, self._waiting_for = self._waiting_for, ""
        if what == "head":
            self._header_timed_out()
        else:
            self.timeout_keep_alive_handler()

    def _header_timed_out(self) -> None:
        if self.transport.is_closing() or not self._in_head:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # An answer is still being produced; once it is written, uvicorn's keep-alive timer
            # bounds the wait for the rest of this head.
            return
        self.notices.note(
            "http_header_timeout",
            f"HTTP connection from {self._client or 'a local socket'} sent no complete request "
            f"head within {self.limits.http_header_timeout:g} s: closed",
        )
        self.transport.close()


def bounded_protocol(
    limits: ConnectionLimits, direct_paths: frozenset[str] = frozenset()
) -> type[BoundedHttpProtocol]:
    """A protocol class for one server: its own connection counts, the given limits, POSTs to
    ``direct_paths`` answered through a :class:`DirectCycle`.

    Pass it as ``uvicorn.Config(http=...)``; uvicorn instantiates it per connection.
    """
    return type(
        "ServerHttpProtocol",
        (BoundedHttpProtocol,),
        {
            "limits": limits,
            "counts": ConnectionCounts(limits),
            "notices": ThrottledLog(log),
            "direct_paths": frozenset(p.encode("ascii") for p in direct_paths),
        },
    )
