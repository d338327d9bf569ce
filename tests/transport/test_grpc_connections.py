"""gRPC connection hygiene on a real grpc.aio server: the connection cap and keepalive enforcement.

The idle limit is proven on a real ``tokenkeys serve`` in test_front_door_attacks.py; here raw
HTTP/2 frames play the misbehaving client (names and codes from RFC 9113: PING is frame type 6,
GOAWAY type 7, ENHANCE_YOUR_CALM error code 0xb, the code grpc core sends with the debug data
``too_many_pings``).
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import grpc

from tokenkeys._gen.openengine.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from tokenkeys.limits import Limits
from tokenkeys.server.grpc.server import start_grpc_server
from tokenkeys.server.grpc.tokenizer import TokenizerService
from tokenkeys.server.runtime.loading import load_models
from tokenkeys.tokenizer import TokenizerOptions
from tokenkeys.transport.grpc_options import grpc_server_options
from tokenkeys.transport.limits import ConnectionLimits

from dos_support import H2_PREFACE, wait_all_closed
from support import LoopServerThread

_PING, _GOAWAY = 6, 7
_ENHANCE_YOUR_CALM = 0xB


class GrpcServer(LoopServerThread):
    """The tokenizer service of the embedded model with the given connection limits."""

    def __init__(self, limits: ConnectionLimits) -> None:
        super().__init__()
        self.limits = limits

    async def _start(self) -> tuple[Any, int]:
        service = TokenizerService(load_models([], TokenizerOptions(), Limits()))
        return await start_grpc_server(
            [lambda s: tokenizer_pb2_grpc.add_OpenEngineTokenizerServicer_to_server(service, s)],
            "127.0.0.1",
            0,
            Limits(),
            connections=self.limits,
        )

    async def _stop(self) -> None:
        await self.server.stop(0)


def _h2_connection(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(H2_PREFACE)
    return sock


def _frames(sock: socket.socket) -> Any:
    """Yield (type, flags, payload) of the frames the server sends until it closes."""
    buffer = b""
    while True:
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            kind, flags = buffer[3], buffer[4]
            yield kind, flags, buffer[9 : 9 + length]
            buffer = buffer[9 + length :]
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return
        if not data:
            return
        buffer += data


def test_options_name_every_limit() -> None:
    options = dict(grpc_server_options(ConnectionLimits(grpc_max_connection_age_grace=30)))
    assert options["grpc.max_allowed_incoming_connections"] == 4096
    assert options["grpc.max_connection_idle_ms"] == 300_000
    assert options["grpc.max_connection_age_ms"] == 3_600_000
    assert options["grpc.max_connection_age_grace_ms"] == 30_000
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 60_000
    assert options["grpc.keepalive_permit_without_calls"] == 0
    unlimited = dict(grpc_server_options(ConnectionLimits(grpc_max_connection_age=0)))
    assert "grpc.max_connection_age_ms" not in unlimited


def test_connections_over_the_cap_are_closed_and_calls_still_answer() -> None:
    with GrpcServer(ConnectionLimits(grpc_max_connections=3)) as server:
        held = [_h2_connection(server.port) for _ in range(3)]
        extra = _h2_connection(server.port)
        assert wait_all_closed([extra], timeout=10) == 0
        extra.close()
        for sock in held:
            sock.close()
        # Once the held connections are gone, a real client gets through again.
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
            reply = stub.Tokenize(
                tokenizer_pb2.TokenizeRequest(texts=["hi"]), timeout=10, wait_for_ready=True
            )
        assert reply.total_tokens > 0


def test_a_client_pinging_too_often_is_sent_away() -> None:
    with GrpcServer(ConnectionLimits(grpc_min_ping_interval=60)) as server:
        sock = _h2_connection(server.port)
        ping = struct.pack(">I", 8)[1:] + bytes([_PING, 0]) + b"\0\0\0\0" + b"12345678"
        for _ in range(5):
            sock.sendall(ping)
        goaway = next((payload for kind, _, payload in _frames(sock) if kind == _GOAWAY), None)
        sock.close()
        assert goaway is not None, "no GOAWAY for a flood of pings"
        assert int.from_bytes(goaway[4:8], "big") == _ENHANCE_YOUR_CALM
        assert b"too_many_pings" in goaway[8:]
