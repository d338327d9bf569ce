"""uvicorn inside the caller's loop: port 0, a taken port, TCP_NODELAY, stop."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from tokenkeys.errors import ConfigError
from tokenkeys.frontend import create_app, start_http_server
from tokenkeys.frontend.server import _bind

from http_support import registry


def test_the_listening_socket_is_tcp_so_responses_are_not_delayed() -> None:
    """asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; with proto 0 every
    JSON answer (head, then body) waited ~40 ms for the client's delayed ACK."""
    sock = _bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


async def test_port_zero_picks_a_port_and_stop_closes_it() -> None:
    app = create_app(registry(engines=False))
    server = await start_http_server(app, "127.0.0.1", 0)
    assert server.port > 0
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
        assert (await client.get("/health")).status_code == 200
        with pytest.raises(ConfigError, match="cannot bind HTTP"):
            await start_http_server(app, "127.0.0.1", server.port)
        await server.stop()
        with pytest.raises(httpx.TransportError):
            await asyncio.wait_for(client.get("/health"), 5)
