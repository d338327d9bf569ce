"""The served engine end to end: KV events per second and Generate-to-event latency.

``bench_events`` measures the raw layer (codec, ZMQ transport, an in-process engine with
stand-in keys). This benchmark measures the full serve stack instead: a ``tokenkeys serve``
subprocess (real cache keys, ``vllm/sha256_cbor@0.31`` at block size 16), requests sent over
gRPC ``Inference.Generate`` as token ids, events received in this process by a ZMQ subscriber
(vLLM msgpack) and by a gRPC ``SubscribeKvEvents`` subscriber (protobuf), both decoded.

The reference, measured in the same run, is the same engine assembly in this process driven by
direct ``generate`` calls (no gRPC, no process hop) into the same ZMQ publisher and subscriber:
the ratio is what the serving layers add.

Each request is a fresh 256-token prompt with ``max_tokens=1``: one event batch per request
holding one 16-block BlockStored and, once the 4,096-block cache is full, 16 BlockRemoved (vLLM
sends one event per removed hash).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
from timing import pct, us

from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys._gen.openengine.v1 import kv_pb2, openengine_pb2_grpc
from tokenkeys.engine.config import EngineConfig, SimulatedConfig
from tokenkeys.engine.protocol import GenerationParams
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_subscriber import ZmqEventSubscriber
from tokenkeys.limits import Limits
from tokenkeys.server.assembly import EngineServer, ServeConfig
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

ROOT = Path(__file__).resolve().parent.parent
PROMPT_TOKENS = 256
NUM_BLOCKS = 4096
CONCURRENCY = 16


def _prompt(i: int) -> list[int]:
    base = (i * 2654435761) % 40_000
    return [(base + k * 7) % 45_000 + 100 for k in range(PROMPT_TOKENS)]


class _Events:
    """Counts events from a ZMQ subscriber and a gRPC subscription, recording arrival times."""

    def __init__(self) -> None:
        self.arrivals: dict[str, dict[int, float]] = {"zmq": {}, "grpc": {}}
        self.events = {"zmq": 0, "grpc": 0}
        self._tasks: list[asyncio.Task[None]] = []

    def start_zmq(self, sub: ZmqEventSubscriber) -> None:
        codec = VllmMsgpackCodec()

        async def loop() -> None:
            async for d in sub:
                self.arrivals["zmq"][d.seq] = time.perf_counter()
                self.events["zmq"] += len(codec.decode(d.payload).events)

        self._tasks.append(asyncio.ensure_future(loop()))

    def start_grpc(self, call) -> None:  # noqa: ANN001 - a SubscribeKvEvents call
        async def loop() -> None:
            async for message in call:
                if message.WhichOneof("event") != "batch":
                    return
                batch = message.batch
                self.arrivals["grpc"][batch.sequence_number] = time.perf_counter()
                self.events["grpc"] += len(batch.events)

        self._tasks.append(asyncio.ensure_future(loop()))

    async def wait_for(self, transport: str, seq: int, timeout: float = 30.0) -> float:
        deadline = time.perf_counter() + timeout
        while seq not in self.arrivals[transport]:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"batch {seq} never reached the {transport} subscriber")
            await asyncio.sleep(0.0002)
        return self.arrivals[transport][seq]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _subscribe_zmq(endpoint: str, replay: str, topic: str, warm) -> ZmqEventSubscriber:  # noqa: ANN001
    """A subscriber that has joined: ``warm()`` publishes until one batch arrives."""
    sub = ZmqEventSubscriber(endpoint, replay_endpoint=replay, topic=topic, hwm=0)
    await sub.start()
    for _ in range(2000):
        await warm()
        try:
            await asyncio.wait_for(sub.recv(), 0.05)
            break
        except asyncio.TimeoutError:
            continue
    else:
        raise RuntimeError("the ZMQ subscriber never joined")
    return sub


# --------------------------------------------------------------------------- the serve stack


def _start_server() -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    args = [
        sys.executable, "-m", "tokenkeys.cli", "serve", "--grpc-port", "0",
        "--num-kv-blocks", str(NUM_BLOCKS), "--kv-events-hwm", "1000000",
        "--kv-events-subscriber-backlog", "1000000",
    ]  # fmt: skip
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "gRPC listening on " in line:
            return proc, "127.0.0.1:" + line.rsplit(":", 1)[1].strip()
    proc.kill()
    raise RuntimeError("tokenkeys serve did not start")


async def _serve_stack(n_throughput: int, n_latency: int) -> dict[str, object]:
    proc, target = _start_server()
    events = _Events()
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            control = openengine_pb2_grpc.ControlStub(channel)
            inference = openengine_pb2_grpc.InferenceStub(channel)
            sources = await control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
            zsrc = next(s for s in sources.sources if s.transport == "zmq")
            counter = iter(range(10**9))

            async def request(i: int) -> None:
                req = gen.GenerateRequest(
                    token_ids=gen.TokenIds(ids=_prompt(i)),
                    stopping=gen.StoppingOptions(max_tokens=1),
                )
                async for _ in inference.Generate(req):
                    pass

            async def warm() -> None:
                await request(10**8 + next(counter))

            endpoint = f"tcp://{zsrc.endpoint_addr.host}:{zsrc.endpoint_addr.port}"
            sub = await _subscribe_zmq(endpoint, zsrc.replay_endpoint, zsrc.topic, warm)
            seq = sub.last_seq + 1
            events.start_zmq(sub)
            grpc_call = control.SubscribeKvEvents(
                kv_pb2.SubscribeKvEventsRequest(start_sequence_number=seq)
            )
            events.start_grpc(grpc_call)
            await warm()
            await events.wait_for("grpc", seq)
            await events.wait_for("zmq", seq)
            await asyncio.sleep(0.2)

            # Throughput: CONCURRENCY clients, each request one batch.
            first = seq + 1
            base = {t: events.events[t] for t in events.events}
            start = time.perf_counter()
            queue = iter(range(n_throughput))

            async def client() -> None:
                for i in queue:
                    await request(i)

            await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
            last = first + n_throughput - 1
            done = {t: await events.wait_for(t, last) for t in ("zmq", "grpc")}
            rates = {t: (events.events[t] - base[t]) / (done[t] - start) for t in ("zmq", "grpc")}
            requests_per_s = n_throughput / (done["zmq"] - start)
            batch_events = (events.events["zmq"] - base["zmq"]) / n_throughput

            # Latency: one request at a time, to its batch on each subscriber.
            lat: dict[str, list[float]] = {"zmq": [], "grpc": [], "rpc": []}
            seq = last
            for i in range(n_latency):
                t0 = time.perf_counter()
                await request(n_throughput + i)
                t_rpc = time.perf_counter()
                seq += 1
                for t in ("zmq", "grpc"):
                    lat[t].append(await events.wait_for(t, seq) - t0)
                lat["rpc"].append(t_rpc - t0)
            grpc_call.cancel()
            await sub.close()
            return {
                "rates": rates,
                "lat": lat,
                "batch_events": batch_events,
                "requests_per_s": requests_per_s,
            }
    finally:
        await events.close()
        proc.terminate()
        proc.wait(10)


# ------------------------------------------------------------------- the in-process reference


async def _reference(n_throughput: int, n_latency: int) -> dict[str, object]:
    models = load_models([ModelSource.default()], TokenizerOptions(), Limits())
    config = EngineConfig(
        engine=SimulatedConfig(num_kv_blocks=NUM_BLOCKS),
        kv_events_hwm=1_000_000,
        kv_events_subscriber_backlog=10**6,
    )
    # The engine side of tokenkeys serve, assembled as the CLI assembles it (no HTTP face).
    server = await EngineServer(models, ServeConfig(engine=config)).start()
    assert server.runtime is not None
    engine = models.get(None).engine
    parts = server.runtime.parts(models.names[0])
    info = parts.zmq_source()
    events = _Events()
    counter = iter(range(10**9))
    params = GenerationParams(max_tokens=1)

    async def request(i: int) -> None:
        async for _ in engine.generate(_prompt(i), params):
            pass

    async def warm() -> None:
        await request(10**8 + next(counter))

    try:
        sub = await _subscribe_zmq(info.endpoint, info.replay_endpoint, info.topic, warm)
        events.start_zmq(sub)
        await asyncio.sleep(0.2)
        first = parts.engine.stream.next_seq
        base = events.events["zmq"]
        start = time.perf_counter()
        queue = iter(range(n_throughput))

        async def client() -> None:
            for i in queue:
                await request(i)

        await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
        done = await events.wait_for("zmq", first + n_throughput - 1)
        rate = (events.events["zmq"] - base) / (done - start)
        lat = []
        for i in range(n_latency):
            seq = parts.engine.stream.next_seq
            t0 = time.perf_counter()
            await request(n_throughput + i)
            lat.append(await events.wait_for("zmq", seq) - t0)
        await sub.close()
        return {"rate": rate, "lat": lat}
    finally:
        await events.close()
        await server.stop()


async def _run_async(quick: bool) -> str:
    n_throughput = 400 if quick else 4000
    n_latency = 100 if quick else 1000
    ref = await _reference(n_throughput, n_latency)
    full = await _serve_stack(n_throughput, n_latency)
    rates, lat = full["rates"], full["lat"]
    ref_rate, ref_lat = ref["rate"], ref["lat"]
    rows = [
        (
            "events/s, Generate over gRPC -> ZMQ subscriber",
            f"{rates['zmq']:,.0f}",
            f"{ref_rate:,.0f} (in-process generate -> ZMQ)",
            f"{rates['zmq'] / ref_rate:.2f}",
        ),
        (
            "events/s, Generate over gRPC -> gRPC SubscribeKvEvents",
            f"{rates['grpc']:,.0f}",
            f"{ref_rate:,.0f}",
            f"{rates['grpc'] / ref_rate:.2f}",
        ),
    ]
    for name, key in (("ZMQ subscriber", "zmq"), ("gRPC subscriber", "grpc")):
        for q in (50, 99):
            rows.append(
                (
                    f"Generate -> its batch on the {name}, p{q}",
                    us(pct(lat[key], q)),
                    f"{us(pct(ref_lat, q))} (in-process generate -> ZMQ)",
                    f"{pct(lat[key], q) / pct(ref_lat, q):.1f}",
                )
            )
    rows.append(
        (
            "Generate round trip (to GenerationFinished), p50",
            us(pct(lat["rpc"], 50)),
            "",
            "",
        )
    )
    lines = [
        "## Served engine: KV events end to end (issue 6)",
        "",
        f"Mode: {'quick' if quick else 'full'}. `tokenkeys serve` subprocess, keys "
        f"`vllm/sha256_cbor@0.31` block 16, {NUM_BLOCKS} KV blocks; {n_throughput} requests "
        f"of {PROMPT_TOKENS} prompt tokens and max_tokens=1 from {CONCURRENCY} concurrent gRPC "
        f"clients for throughput ({full['requests_per_s']:,.0f} requests/s, one batch each, "
        f"{full['batch_events']:.1f} events per batch on average), "
        f"{n_latency} sequential requests for latency. Subscribers decode every batch.",
        "",
        "| measurement | serve stack | reference | ratio |",
        "|---|---|---|---|",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
        "",
    ]
    return "\n".join(lines)


def run(quick: bool) -> str:
    """Run the served-engine benchmark and return a Markdown section."""
    return asyncio.run(_run_async(quick))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    print(run(quick=True))
