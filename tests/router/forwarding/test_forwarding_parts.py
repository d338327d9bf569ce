"""The front door's parts on their own: worker specs, the promise, the event relay and its
HTTP/1.1 client (against real loopback servers that answer in pieces, break off or close)."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from certs import make_certs
from starlette.requests import Request

from tokenkeys.errors import ConfigError
from tokenkeys.router.forwarding.client_side import ClientGone, unless_gone
from tokenkeys.router.forwarding.frontends import WorkerFrontends, split_worker
from tokenkeys.router.forwarding.http1 import Broken, Client, Unreachable
from tokenkeys.router.forwarding.promise import Promise, expected_tokens, matched_at
from tokenkeys.router.forwarding.relay import events, request_headers
from tokenkeys.router.workers.discovery import WorkerDescription
from tokenkeys.router.workers.state import WorkerState
from tokenkeys.transport.http_protocol import DISCONNECT


def test_a_worker_spec_names_grpc_and_optionally_http():
    assert split_worker("10.0.0.7:50051") == ("10.0.0.7:50051", None)
    assert split_worker("10.0.0.7:50051,http://10.0.0.7:8000/") == (
        "10.0.0.7:50051",
        "http://10.0.0.7:8000",
    )
    for bad in ("10.0.0.7:50051,10.0.0.7:8000", "h:1,ftp://h:2", "h:1,http://h", "nope"):
        with pytest.raises(ConfigError) as caught:
            split_worker(bad)
        assert caught.value.field == "worker"


def test_the_engine_never_serves_the_last_token_from_cache():
    # vLLM 0.32: max_cache_hit_length = num_tokens - 1, whole blocks below it.
    assert expected_tokens(4, 64, 16) == 48
    assert expected_tokens(4, 65, 16) == 64
    assert expected_tokens(2, 65, 16) == 32
    assert expected_tokens(0, 65, 16) == 0


def test_a_promise_against_its_answer():
    promise = Promise("w:1", "m", 16, (65, 40), (4, 1))
    assert promise.expected_tokens == 64 + 16
    assert promise.difference is None and not promise.over_promised
    served = promise.answered({"prompt_tokens_details": {"cached_tokens": 64}})
    assert served.difference == -16 and served.over_promised
    assert promise.answered({"prompt_tokens": 3}) is promise  # no cached_tokens: nothing known


class _Decision:
    def cached_blocks(self, worker: str) -> int:
        return {"w:1": 3, "w:2": 1}.get(worker, 0)


def test_a_request_for_prompt_logprobs_is_promised_no_cached_blocks():
    # vLLM reads nothing from its prefix cache for such a request (it computes every prompt
    # position's logprobs): SamplingParams.skip_reading_prefix_cache, vLLM 0.32.
    decisions = [_Decision(), _Decision()]
    assert matched_at("w:1", decisions, {"prompt": "x"}) == (3, 3)
    assert matched_at("w:2", decisions, {"prompt_logprobs": None}) == (1, 1)
    assert matched_at("w:1", decisions, {"prompt_logprobs": 0}) == (0, 0)
    assert matched_at("w:1", decisions, {"prompt_logprobs": 2}) == (0, 0)


def test_the_worker_gets_the_routers_credentials_not_the_clients():
    sent = request_headers(
        [
            (b"authorization", b"Bearer client"),
            (b"x-request-id", b"r1"),
            (b"traceparent", b"00-abc-def-01"),
            (b"content-length", b"12"),
            (b"connection", b"keep-alive"),
            (b"content-type", b"application/json"),
        ],
        "router-token",
    )
    assert sent == [
        (b"x-request-id", b"r1"),
        (b"traceparent", b"00-abc-def-01"),
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer router-token"),
    ]


Answering = Callable[[asyncio.StreamReader, asyncio.StreamWriter], "asyncio.Future[None]"]


@asynccontextmanager
async def http_server(answer: Answering, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """A real TCP server on loopback (HTTPS with ``tls``) that runs ``answer`` per connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


async def test_events_are_relayed_whole_and_a_break_ends_with_an_error_and_done():
    # A chunked event stream that breaks in the middle of the third event.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for piece in (b'data: {"a": 1}\n\ndata: {"b"', b': 2}\n\ndata: {"c'):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)

    async with http_server(answer) as url:
        client = Client(5.0)
        response = await client.request(b"POST", url + "/v1/completions", [], b"{}")
        assert response.header(b"content-type") == b"text/event-stream"
        seen: list[bytes] = []
        out = b"".join([c async for c in events(response, seen.append)])
        await client.close()
    assert seen == [b'data: {"a": 1}', b'data: {"b": 2}']
    parts = out.decode().split("\n\n")
    assert parts[:2] == ['data: {"a": 1}', 'data: {"b": 2}']
    assert json.loads(parts[2].removeprefix("data: "))["error"]["code"] == 503
    assert parts[3:] == ["data: [DONE]", ""]


async def test_the_client_sends_head_and_body_and_reuses_a_kept_alive_connection():
    connections: list[list[bytes]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads: list[bytes] = []
        connections.append(heads)
        while not reader.at_eof():
            try:
                head, body = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            heads.append(head)
            reply = b'{"echo": ' + body + b"}"
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(reply), reply))
            await writer.drain()

    async with http_server(answer) as url:
        client = Client(5.0)
        for n in range(3):
            headers = [(b"x-request-id", b"r%d" % n)]
            response = await client.request(b"POST", url + "/v1/completions", headers, b"[%d]" % n)
            assert (response.status, await response.read()) == (200, b'{"echo": [%d]}' % n)
            response.close()
        await client.close()
    assert len(connections) == 1 and len(connections[0]) == 3  # one connection, kept alive
    first = connections[0][0].split(b"\r\n")
    assert first[0] == b"POST /v1/completions HTTP/1.1"
    assert b"x-request-id: r0" in first and b"content-length: 3" in first


async def test_a_connection_closed_by_the_worker_as_it_is_reused_is_retried_once_fresh():
    # The worker answers, then closes each connection without saying so (no "connection:
    # close"): the client learns it either from the EOF or when the reused one fails unanswered.
    served = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        await read_request(reader)
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    async with http_server(answer) as url:
        client = Client(5.0)
        for _ in range(3):
            response = await client.request(b"POST", url + "/x", [], b"{}")
            assert await response.read() == b"ok"
            response.close()
        await client.close()
    assert served == 3


async def test_the_sent_hook_runs_once_the_request_is_written_before_its_answer():
    # The worker answers only once the hook ran: a hook run after the answer would never run.
    # Each connection is closed after one answer without saying so, so every reuse is the
    # stale-connection case, sent once more: the hook still runs once per request.
    hooked = asyncio.Event()
    calls = 0

    def sent() -> None:
        nonlocal calls
        calls += 1
        hooked.set()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await hooked.wait()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    async with http_server(answer) as url:
        client = Client(5.0)
        for n in range(3):
            hooked.clear()
            request = client.request(b"POST", url + "/x", [], b"{}", sent=sent)
            response = await asyncio.wait_for(request, 30)  # a bound, not a measure
            assert await response.read() == b"ok"
            response.close()
            assert calls == n + 1
        await client.close()


async def test_failures_before_the_head_are_unreachable_after_it_broken():
    async def head_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    client = Client(0.2)
    async with http_server(head_then_close) as url:
        response = await client.request(b"POST", url + "/x", [], b"{}")
        with pytest.raises(Broken, match="connection lost"):
            await response.read()
        response.close()
    with pytest.raises(Unreachable, match="cannot connect"):
        await client.request(b"POST", url + "/x", [], b"{}")  # nobody listens any more
    async with http_server(silent) as url:
        with pytest.raises(Unreachable, match="no byte from the worker for 0.2 s"):
            await client.request(b"POST", url + "/x", [], b"{}")
    await client.close()


def _worker(address: str, http_frontend: str) -> WorkerState:
    description = WorkerDescription(address, "i", "tokenkeys-sim", "0", (), http_frontend)
    return WorkerState(address, None, None, description=description)  # type: ignore[arg-type]


def test_where_a_workers_frontend_lives():
    workers = {
        "10.0.0.7:50051": _worker("10.0.0.7:50051", "http://10.0.0.7:8000"),
        "10.0.0.8:50051": _worker("10.0.0.8:50051", "http://:8000"),  # host: the one dialed
        "10.0.0.9:50051": _worker("10.0.0.9:50051", ""),  # gRPC only
    }
    named = {"10.0.0.7:50051": "http://proxy:9000"}
    frontends = WorkerFrontends(workers, named)
    assert frontends.url("10.0.0.7:50051") == "http://proxy:9000"  # named wins
    assert frontends.url("10.0.0.8:50051") == "http://10.0.0.8:8000"
    assert frontends.url("10.0.0.9:50051") is None
    assert WorkerFrontends(workers, {}).url("10.0.0.7:50051") == "http://10.0.0.7:8000"


async def test_the_client_speaks_tls_to_a_worker_its_ca_signed(tmp_path):
    certs = make_certs(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(certs.server_cert, certs.server_key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    async with http_server(answer, served) as url:
        trusting = Client(5.0, tls=ssl.create_default_context(cafile=str(certs.ca)))
        response = await trusting.request(b"POST", url + "/x", [], b"{}")
        assert (response.status, await response.read()) == (200, b"ok")
        response.close()
        await trusting.close()
        stranger = Client(5.0, tls=ssl.create_default_context(cafile=str(certs.other_ca)))
        with pytest.raises(Unreachable, match="SSL"):
            await stranger.request(b"POST", url + "/x", [], b"{}")
        await stranger.close()


def _request(receive: Callable, extensions: dict | None = None) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    if extensions is not None:
        scope["extensions"] = extensions
    return Request(scope, receive)


async def test_a_client_gone_while_a_worker_is_awaited_cancels_the_wait():
    # The server's future of the connection (this server's extension), and a server without
    # it, whose receive() says http.disconnect: either way the wait is cancelled.
    async def never() -> dict:
        await asyncio.Event().wait()
        return {}

    async def leaves() -> dict:
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    lost = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.05, lost.set_result, None)
    for request in (_request(never, {DISCONNECT: lost}), _request(leaves)):
        cancelled = asyncio.Event()

        async def worker(cancelled: asyncio.Event) -> str:
            try:
                await asyncio.sleep(30)
            finally:
                cancelled.set()
            return "answer"

        with pytest.raises(ClientGone):
            await unless_gone(request, worker(cancelled))
        assert cancelled.is_set()
        await asyncio.sleep(0)  # the caller's task goes on, uncancelled


async def test_an_answer_before_the_client_leaves_is_returned_and_the_watch_ends():
    lost = asyncio.get_running_loop().create_future()

    async def never() -> dict:
        await asyncio.Event().wait()
        return {}

    async def worker() -> str:
        await asyncio.sleep(0.01)
        return "answer"

    assert await unless_gone(_request(never, {DISCONNECT: lost}), worker()) == "answer"
    lost.set_result(None)  # the connection closes later: this request is no longer watched
    await asyncio.sleep(0.05)
    assert await unless_gone(_request(never), worker()) == "answer"
