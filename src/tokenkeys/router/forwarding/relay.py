"""The relay to the workers' frontends: a request out, its answer back.

One pooled HTTP/1.1 client (:mod:`.http1`) for every worker. What goes out is the client's body
byte for byte and its end-to-end headers (``x-request-id``, ``traceparent``, ...); hop-by-hop
headers, ``host``, the body length and the client's own credentials stay behind, and the router's
token (the one its gRPC channels carry) is the worker's ``authorization``. ``accept-encoding``
is dropped too, so the router reads the usage of the answers it relays.

:meth:`Relay.open` returns once the worker's status and headers arrived (the first byte of the
answer): a failure before that is :class:`WorkerUnreachable`, which the caller may retry on
another worker. Server-sent events are then relayed one whole event at a time
(:func:`events`), so a stream that breaks after its first byte ends with an error event and
``[DONE]``, as vLLM ends a stream whose generation failed
(vLLM 0.32 ``vllm/entrypoints/openai/chat_completion/serving.py``: the error of
``create_streaming_error_response``, ``vllm/entrypoints/generate/base/serving.py``,
then ``data: [DONE]``), never with half an event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable

import orjson

from tokenkeys.access.channel import ChannelSecurity
from tokenkeys.errors import Unavailable
from tokenkeys.frontend.errors import error_of
from tokenkeys.router.forwarding.http1 import CONNECT_TIMEOUT, Broken, Client, Reply, Unreachable

#: Generation may take minutes between bytes (a long prefill, a queue): the router waits as
#: long as the sidecar waits for vLLM (``engine.vllm.client.READ_TIMEOUT``).
READ_TIMEOUT = 600.0
#: An idle connection to a worker is dropped before the worker's own idle timeout would close
#: it (``transport.limits`` ``http_idle_timeout``, 5 s; uvicorn's default too): a request sent
#: on a connection the worker is closing at that moment fails for no fault of the worker.
KEEPALIVE_EXPIRY = 2.0

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED = frozenset(
    h.encode() for h in _HOP_BY_HOP | {"host", "content-length", "authorization", "accept-encoding"}
)
#: Response headers the router's own server sets (or recomputes) itself.
_NOT_RETURNED = frozenset(h.encode() for h in _HOP_BY_HOP | {"content-length", "date", "server"})

Headers = list[tuple[bytes, bytes]]


class WorkerUnreachable(Exception):
    """The worker failed before the first byte of its answer (the request may go elsewhere)."""


def request_headers(headers: Iterable[tuple[bytes, bytes]], token: str | None) -> Headers:
    """The headers a worker gets (lower-case names, as ASGI gives them): the client's
    end-to-end ones, the router's credentials."""
    out = [(k, v) for k, v in headers if k not in _NOT_FORWARDED]
    if token:
        out.append((b"authorization", b"Bearer " + token.encode("latin-1")))
    return out


def answer_headers(answer: Reply) -> Headers:
    """The worker's response headers the client gets (repeated ones kept)."""
    return [(k, v) for k, v in answer.headers if k not in _NOT_RETURNED]


class Relay:
    """The router's HTTP client to its workers' frontends; see the module doc."""

    def __init__(self, security: ChannelSecurity | None = None) -> None:
        self._token = security.token if security is not None else None
        tls = security.tls if security is not None else None
        self._http = Client(
            READ_TIMEOUT,
            tls=tls.ssl_context() if tls is not None else None,
            keepalive_expiry=KEEPALIVE_EXPIRY,
        )

    async def open(
        self,
        url: str,
        body: bytes,
        headers: Iterable[tuple[bytes, bytes]],
        sent: Callable[[], None] | None = None,
    ) -> Reply:
        """POST ``body`` to ``url`` with the client's ``headers`` (ASGI's raw list); the answer
        once its head arrived (body unread). ``sent`` is called once the request is written
        (:meth:`.http1.Client.request`)."""
        try:
            out = request_headers(headers, self._token)
            return await self._http.request(b"POST", url, out, body, sent=sent)
        except Unreachable as exc:
            raise WorkerUnreachable(str(exc)) from None

    async def get_json(self, url: str, timeout: float = CONNECT_TIMEOUT) -> object:
        """GET ``url`` with the router's credentials; its JSON (Unreachable, Broken or
        ValueError: another status, or not JSON)."""
        headers = request_headers((), self._token)
        answer = await self._http.request(b"GET", url, headers, read_timeout=timeout)
        try:
            body = await answer.read()
        finally:
            answer.close()
        if answer.status != 200:
            raise ValueError(f"GET {url} answered {answer.status}")
        return orjson.loads(body)

    async def close(self) -> None:
        """Close every pooled connection."""
        await self._http.close()


async def read_all(answer: Reply) -> bytes:
    """A whole answer's body; Unavailable when the worker breaks off in the middle."""
    try:
        return await answer.read()
    except Broken as exc:
        raise Unavailable(f"the worker broke off its answer: {exc}", field="worker") from None
    finally:
        answer.close()


async def events(answer: Reply, on_event: Callable[[bytes], None]) -> AsyncIterator[bytes]:
    """The worker's server-sent events, one whole event per chunk, each shown to
    ``on_event``; a break ends the stream with an error event and ``[DONE]``."""
    pending = b""
    try:
        async for chunk in answer.chunks():
            pending += chunk
            *whole, pending = pending.split(b"\n\n")
            if whole:
                for event in whole:
                    on_event(event)
                yield b"\n\n".join(whole) + b"\n\n"
        if pending:
            yield pending
    except Broken as exc:
        error = Unavailable(f"the worker broke off the stream: {exc}", field="worker")
        yield b"data: " + orjson.dumps(error_of(error)[1]) + b"\n\ndata: [DONE]\n\n"
    finally:
        # On a client disconnect this runs as the generator is closed: closing the worker's
        # connection (not reusable, its answer unread) is what tells it to abort the request.
        answer.close()


async def raw(answer: Reply) -> AsyncIterator[bytes]:
    """A streamed answer that is not server-sent events, chunk by chunk."""
    try:
        async for chunk in answer.chunks():
            yield chunk
    finally:
        answer.close()
