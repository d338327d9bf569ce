"""smg-grpc-servicer 0.14.1's KV-event relay, streaming, with its vLLM hash check on, behind the
driver protocol (own virtualenv).

``serve`` starts a real gRPC server on loopback whose ``VllmEngine.SubscribeKvEvents`` is the
released ``smg_grpc_servicer.kv_relay.relay`` over the given vLLM-wire ZMQ publisher (its SUB,
its gap replay through the publisher's ROUTER, its normalizer) with
``hash_check="vllm-sha256-cbor"``: every store whose parent it knows is rehashed vLLM's way
(``sha256_cbor``, the default seed) and counted. ``closed`` answers the counters of every stream
that has ended (the relay hands them to ``on_counts`` as a stream closes). Every other method
of the service is the generated servicer's UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from importlib.metadata import version
from typing import Any

from driver_loop import protocol_stdout, serve

answers = protocol_stdout()

import grpc  # noqa: E402 - after the stdout switch
from smg_grpc_proto.generated import vllm_engine_pb2_grpc  # noqa: E402
from smg_grpc_servicer.kv_relay import Engine, RankSource, relay  # noqa: E402

HASH_CHECK = "vllm-sha256-cbor"

loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()


def _run(coroutine) -> Any:  # noqa: ANN001 - a coroutine
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()


class RelayServicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    """``SubscribeKvEvents`` as the released relay; the counters of each ended stream kept."""

    def __init__(self, source: RankSource, topic: str) -> None:
        self.source = source
        self.topic = topic
        self.closed: list[dict[str, Any]] = []

    async def SubscribeKvEvents(self, request, context):  # noqa: ANN001, ANN201, N802
        async for batch in relay(
            [self.source],
            Engine.VLLM,
            request.start_sequence_number,
            context,
            topic=self.topic,
            hash_check=HASH_CHECK,
            on_counts=lambda counts: self.closed.append(dataclasses.asdict(counts)),
        ):
            yield batch


servers: list[tuple[Any, RelayServicer]] = []


async def _serve(request: dict[str, Any]) -> dict[str, int]:
    """A relay server over one publisher (``endpoint``, ``replay_endpoint``, ``topic``): its
    index (for ``closed``) and port."""
    source = RankSource(0, request["endpoint"], request.get("replay_endpoint"))
    servicer = RelayServicer(source, request.get("topic", ""))
    server = grpc.aio.server()
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    servers.append((server, servicer))
    return {"index": len(servers) - 1, "port": port}


def closed(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The counters of every ended stream of server ``index``, in the order they ended."""
    return _run(_closed(request["index"]))


async def _closed(index: int) -> list[dict[str, Any]]:
    return list(servers[index][1].closed)


async def _stop() -> None:
    for server, _ in servers:
        await server.stop(grace=None)


try:
    serve(
        {
            "version": lambda _request: version("smg-grpc-servicer"),
            "serve": lambda request: _run(_serve(request)),
            "closed": closed,
        },
        answers,
    )
finally:
    _run(_stop())
