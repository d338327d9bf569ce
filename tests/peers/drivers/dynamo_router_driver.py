"""Dynamo's ``KvRouter`` (ai-dynamo-runtime 1.6.1) behind the driver protocol (own virtualenv).

The router proper, not the bare radix tree: each engine is a Dynamo worker with its own
``DistributedRuntime`` (an endpoint instance, a tensor model card with KV-event publishing on,
and a ``KvEventPublisher`` relaying the engine's vLLM-wire ZMQ stream), and one more runtime
holds the ``KvRouter`` whose ``get_overlap_scores`` is asked. No etcd or NATS: the runtimes
share the ``file`` discovery backend (``DYN_FILE_KV``, a temporary folder) and the ``zmq``
event plane, every socket on loopback. This is how Dynamo's own binding tests run a router
without services (``tests/router`` in ai-dynamo/dynamo: ``mem`` discovery, ``zmq`` event
plane, ``register_model`` with ``ModelInput.Tensor`` for the card); ``file`` instead of
``mem`` because every worker needs its own runtime (a worker id is a runtime's connection id)
and ``mem`` stores are per runtime.

The asyncio loop the bindings need runs in a thread; requests are answered from the main one.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from importlib.metadata import version
from typing import Any

from driver_loop import protocol_stdout, serve

answers = protocol_stdout()

# Loopback only, and the router counts workers as they come (it waits for none).
os.environ.setdefault("DYN_FILE_KV", tempfile.mkdtemp(prefix="dynamo-kv-"))
os.environ["DYN_TCP_RPC_HOST"] = "127.0.0.1"
os.environ["DYN_EVENT_PLANE_HOST"] = "127.0.0.1"
os.environ["DYN_ROUTER_MIN_INITIAL_WORKERS"] = "0"

from dynamo.llm import (  # noqa: E402 - after the stdout switch and the environment
    KvEventPublisher,
    KvRouter,
    KvRouterConfig,
    ModelInput,
    ModelRuntimeConfig,
    ModelType,
    WorkerType,
    register_model,
)
from dynamo.runtime import DistributedRuntime  # noqa: E402

ENDPOINT = "tokenkeys.worker.generate"

loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()


def _run(coroutine) -> Any:  # noqa: ANN001 - a coroutine
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()


def _runtime() -> DistributedRuntime:
    return DistributedRuntime(loop, "file", "tcp", event_plane="zmq")


class Fleet:
    """The workers (engine index -> Dynamo worker) and the router over them."""

    def __init__(self) -> None:
        self.workers: list[tuple[Any, Any, Any]] = []  # runtime, endpoint, publisher
        self.endpoints: list[str] = []  # each engine's ZMQ endpoint
        self.model = ""
        self.block_size = 0
        self.router: Any = None
        self.runtime: Any = None

    async def start(self, request: dict[str, Any]) -> list[int]:
        """One worker per engine endpoint, then the router; the workers' ids."""
        self.model, self.block_size = request["model"], request["block_size"]
        self.endpoints = list(request["endpoints"])
        self.workers = [await self._worker(endpoint) for endpoint in self.endpoints]
        self.runtime = _runtime()
        self.router = KvRouter(
            self.runtime.endpoint(ENDPOINT),
            self.block_size,
            KvRouterConfig(use_kv_events=True, router_event_threads=1),
        )
        return [endpoint.connection_id() for _, endpoint, _ in self.workers]

    async def restart(self, request: dict[str, Any]) -> int:
        """Worker ``index`` leaves (relay shut down, instance unregistered, runtime down) and a
        new one relays the same engine endpoint: a Dynamo worker process restarting with its
        engine. The new worker's id."""
        index = request["index"]
        runtime, endpoint, publisher = self.workers[index]
        publisher.shutdown()
        await endpoint.unregister_endpoint_instance()
        runtime.shutdown()
        self.workers[index] = await self._worker(self.endpoints[index])
        return self.workers[index][1].connection_id()

    async def _worker(self, zmq_endpoint: str) -> tuple[Any, Any, Any]:
        runtime = _runtime()
        endpoint = runtime.endpoint(ENDPOINT)
        await endpoint.register_endpoint_instance()
        config = ModelRuntimeConfig()
        config.kv_event_publishing_enabled = True
        await register_model(
            ModelInput.Tensor,
            ModelType.TensorBased,
            endpoint,
            self.model,
            worker_type=WorkerType.Aggregated,
            runtime_config=config,
            kv_cache_block_size=self.block_size,
        )
        # The relay Dynamo's own vLLM workers run: it subscribes to the engine's ZMQ stream
        # (every topic) and republishes on Dynamo's event plane. It is live-only: what the
        # engine publishes while it is not connected is lost (no replay).
        publisher = KvEventPublisher(
            endpoint, kv_block_size=self.block_size, zmq_endpoint=zmq_endpoint, zmq_topic=""
        )
        return runtime, endpoint, publisher

    async def overlap(self, request: dict[str, Any]) -> dict[str, int]:
        """Engine index -> device-tier matched blocks (engines matching none left out)."""
        scores = await self.router.get_overlap_scores(
            request["token_ids"],
            lora_name=request.get("lora_name"),
            include_shared=False,
            cache_namespace=request.get("cache_namespace"),
        )
        index = {endpoint.connection_id(): i for i, (_, endpoint, _) in enumerate(self.workers)}
        return {
            str(index[row["worker_id"]]): row["device_blocks"]
            for row in scores["workers"]
            if row["device_blocks"]
        }

    def close(self) -> None:
        for _, _, publisher in self.workers:
            publisher.shutdown()
        for runtime, _, _ in self.workers:
            runtime.shutdown()
        if self.runtime is not None:
            self.runtime.shutdown()


fleet = Fleet()
try:
    serve(
        {
            "version": lambda _request: version("ai-dynamo-runtime"),
            "start": lambda request: _run(fleet.start(request)),
            "overlap": lambda request: _run(fleet.overlap(request)),
            "restart": lambda request: _run(fleet.restart(request)),
        },
        answers,
    )
finally:
    fleet.close()
