"""The HTTP client of the front door: a request to a worker's frontend, its answer back.

One ``httpx.AsyncClient`` (pooled connections) for every worker. What goes out is the client's
body byte for byte and its end-to-end headers (``x-request-id``, ``traceparent``, ...); hop-by-hop
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

from collections.abc import AsyncIterator, Callable, Mapping

import anyio
import httpx
import orjson

from tokenkeys.access.channel import ChannelSecurity
from tokenkeys.errors import Unavailable
from tokenkeys.frontend.errors import error_of

#: Generation may take minutes between bytes (a long prefill, a queue): the router waits as
#: long as the sidecar waits for vLLM (``engine.vllm.client.READ_TIMEOUT``).
CONNECT_TIMEOUT = 5.0
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
_NOT_FORWARDED = _HOP_BY_HOP | {"host", "content-length", "authorization", "accept-encoding"}
#: Response headers the router's own server sets (or recomputes) itself.
_NOT_RETURNED = frozenset(h.encode() for h in _HOP_BY_HOP | {"content-length", "date", "server"})


class WorkerUnreachable(Exception):
    """The worker failed before the first byte of its answer (the request may go elsewhere)."""


def request_headers(headers: Mapping[str, str], token: str | None) -> dict[str, str]:
    """The headers a worker gets: the client's end-to-end ones, the router's credentials."""
    out = {k: v for k, v in headers.items() if k.lower() not in _NOT_FORWARDED}
    if token:
        out["authorization"] = f"Bearer {token}"
    return out


def answer_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    """The worker's response headers the client gets (raw, repeated ones kept)."""
    return [(k.lower(), v) for k, v in response.headers.raw if k.lower() not in _NOT_RETURNED]


class Relay:
    """The router's HTTP client to its workers' frontends; see the module doc."""

    def __init__(self, security: ChannelSecurity | None = None) -> None:
        self._token = security.token if security is not None else None
        tls = security.tls if security is not None else None
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT),
            limits=httpx.Limits(
                max_connections=None,
                max_keepalive_connections=256,
                keepalive_expiry=KEEPALIVE_EXPIRY,
            ),
            verify=tls.ssl_context() if tls is not None else True,
        )

    async def open(self, url: str, body: bytes, headers: Mapping[str, str]) -> httpx.Response:
        """POST ``body`` to ``url``; the response once its headers arrived (body unread)."""
        request = self._http.build_request(
            "POST", url, content=body, headers=request_headers(headers, self._token)
        )
        try:
            return await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise WorkerUnreachable(f"{type(exc).__name__}: {exc}") from None

    async def get_json(self, url: str, timeout: float = CONNECT_TIMEOUT) -> object:
        """GET ``url`` with the router's credentials; its JSON (HTTPError or ValueError)."""
        headers = request_headers({}, self._token)
        response = await self._http.get(url, headers=headers, timeout=timeout)
        response.raise_for_status()
        return response.json()

    async def close(self) -> None:
        """Close every pooled connection."""
        await self._http.aclose()


async def read_all(response: httpx.Response) -> bytes:
    """A whole answer's body; Unavailable when the worker breaks off in the middle."""
    try:
        return await response.aread()
    except httpx.HTTPError as exc:
        raise Unavailable(
            f"the worker broke off its answer: {type(exc).__name__}: {exc}", field="worker"
        ) from None
    finally:
        await response.aclose()


async def events(
    response: httpx.Response, on_event: Callable[[bytes], None]
) -> AsyncIterator[bytes]:
    """The worker's server-sent events, one whole event per chunk, each shown to
    ``on_event``; a break ends the stream with an error event and ``[DONE]``."""
    pending = b""
    try:
        async for chunk in response.aiter_raw():
            pending += chunk
            *whole, pending = pending.split(b"\n\n")
            if whole:
                for event in whole:
                    on_event(event)
                yield b"\n\n".join(whole) + b"\n\n"
        if pending:
            yield pending
    except httpx.HTTPError as exc:
        error = Unavailable(
            f"the worker broke off the stream: {type(exc).__name__}: {exc}", field="worker"
        )
        yield b"data: " + orjson.dumps(error_of(error)[1]) + b"\n\ndata: [DONE]\n\n"
    finally:
        # Shielded: on a client disconnect this runs cancelled, and closing the connection is
        # what tells the worker to abort the request.
        with anyio.CancelScope(shield=True):
            await response.aclose()


async def raw(response: httpx.Response) -> AsyncIterator[bytes]:
    """A streamed answer that is not server-sent events, chunk by chunk."""
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()
