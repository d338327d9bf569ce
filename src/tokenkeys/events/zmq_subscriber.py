"""Receive KV-event payloads from a vLLM-style ZMQ publisher, in order, repairing gaps by replay.

The wire is vLLM 0.33's (`vllm/distributed/kv_events.py`): SUB frames ``[topic, seq (8 bytes
big-endian), payload]``; replay over a DEALER socket that sends ``[b"", start_seq]`` and reads
``[b"", topic, seq, payload]`` per batch until ``[b"", b"", ff*8, b""]``. vLLM <= 0.25 replies
without the topic frame; both shapes are accepted. (A REQ socket, as in vLLM's example
subscriber, would only see the first replayed batch per request, hence DEALER.)

Sequence handling, per publisher:

- ``seq > last + 1``: a gap. The missing batches are requested from the replay socket and
  delivered before the live one; those the publisher no longer buffers are counted in
  ``Delivery.lost_before`` (from the first delivery on: before it, the subscriber had no
  position to miss anything from).
- ``seq <= last``: a live PUB stream never goes back, so the publisher restarted (its counter
  starts at 0 again). The next delivery has ``restarted=True``: forget everything this source
  said before. Batches 0..seq-1 of the new run are replayed if still buffered.

Catching up (``start_seq`` given): ZMQ's subscriber joins late, so what the publisher sends
between ``connect()`` and the moment its PUB socket has the subscription is dropped without a
trace, and a gap shows only at the next live batch, which an idle engine may not send for a long
time. So once the connection's handshake succeeds (a socket monitor reports it; the subscription
goes out on that same connection at that moment), ``start_seq`` onwards is asked of the replay
socket and delivered first. Live batches that the replay already delivered (the same sequence
number and the same bytes) are dropped; any other live batch ends that window.

Limit of the protocol: a publisher that restarts and publishes more than ``last + 1`` batches
before the subscriber sees one is indistinguishable from a gap (vLLM's stream has no epoch).

This module only moves bytes; payloads are decoded elsewhere (``vllm_codec``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass

import zmq
import zmq.asyncio

from tokenkeys.errors import FailedPrecondition, InvalidArgument, Unavailable
from tokenkeys.events.zmq_endpoint import bind, check_endpoint
from tokenkeys.events.zmq_publisher import END_SEQ

log = logging.getLogger(__name__)

#: Past any sequence number: a catch-up replay asks for everything from its start on.
_NO_END = 1 << 64


@dataclass(frozen=True)
class Delivery:
    """One batch payload, delivered in sequence order.

    ``restarted``: the publisher restarted before this batch; drop state learned from it.
    ``lost_before``: batches just before this one that were neither received nor replayable.
    """

    topic: str
    seq: int
    payload: bytes
    replayed: bool = False
    restarted: bool = False
    lost_before: int = 0


@dataclass
class SubscriberStats:
    """Counters of a subscriber's work."""

    received: int = 0
    replayed: int = 0
    lost: int = 0
    restarts: int = 0
    malformed_messages: int = 0
    replay_requests: int = 0
    replay_failures: int = 0


class ZmqEventSubscriber:
    """SUB + DEALER client of one KV-event publisher; iterate it for :class:`Delivery` items.

    ``topic`` is the SUB prefix filter ("" = everything). ``start_seq``: when given, the first
    connection's handshake triggers a replay of ``start_seq`` onwards (catching up on what was
    published before this subscriber connected; see the module doc). ``hwm`` is the SUB
    receive high-water mark (vLLM's publisher default is 100,000 batches). ``bind=True`` binds
    ``endpoint`` for publishers that connect (vLLM connects when its endpoint has no wildcard).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        start_seq: int | None = None,
        replay_timeout: float = 2.0,
        hwm: int = 100_000,
        bind: bool = False,
        context: zmq.Context | None = None,
    ) -> None:
        check_endpoint(endpoint, "endpoint")
        if replay_endpoint is not None:
            check_endpoint(replay_endpoint, "replay_endpoint")
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self._bind = bind
        self._hwm = hwm
        self._replay_timeout = replay_timeout
        self._ctx = context or zmq.Context.instance()
        self._last: int | None = None if start_seq is None else start_seq - 1
        #: Whether a batch was delivered since start or the last rewind (``lost_before`` counts
        #: only what a positioned subscriber missed).
        self._positioned = False
        self._pending: deque[Delivery] = deque()
        self._sub: zmq.asyncio.Socket | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._accepting: asyncio.Future[None] | None = None
        #: Payloads by seq that the catch-up replay delivered; the same batch arriving live
        #: afterwards is not delivered twice (see the module doc).
        self._echo: dict[int, bytes] = {}
        self.stats = SubscriberStats()

    async def start(self) -> None:
        """Open the SUB socket and subscribe to the topic."""
        if self._sub is not None:
            return
        sock = zmq.asyncio.Context(shadow=self._ctx).socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self._hwm)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode("utf-8"))
        # Watched before connecting, so the first handshake cannot pass unseen.
        monitor = self._catch_up_monitor(sock)
        try:
            if self._bind:
                await bind(sock, self.endpoint)
            else:
                sock.connect(self.endpoint)
        except zmq.ZMQError as exc:
            if monitor is not None:
                monitor.close(linger=0)
            sock.close(linger=0)
            raise Unavailable(
                f"cannot open KV-event subscription at {self.endpoint!r}: {exc}",
                field="endpoint",
            ) from exc
        self._sub = sock
        if monitor is not None:
            # recv() waits for this first, as for any replay in flight; live batches queue in
            # the SUB socket meanwhile.
            self._accepting = asyncio.ensure_future(self._catch_up(monitor))

    def _catch_up_monitor(self, sock: zmq.asyncio.Socket) -> zmq.asyncio.Socket | None:
        """A monitor of ``sock``'s handshakes when there is a position to catch up from."""
        if self._last is None or self.replay_endpoint is None:
            return None
        return sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)

    async def _catch_up(self, monitor: zmq.asyncio.Socket) -> None:
        """After the first handshake, deliver what was published from ``last + 1`` on."""
        try:
            await monitor.recv_multipart()
        finally:
            if self._sub is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self._sub.disable_monitor()
            monitor.close(linger=0)
        start = 0 if self._last is None else self._last + 1
        replayed = await self._replay(start, _NO_END, self.topic)
        if not replayed:
            return
        topic, seq, payload = replayed[-1]
        self._deliver(topic, seq, payload, False, start, replayed[:-1], replayed_last=True)
        self._echo = {r_seq: r_payload for _, r_seq, r_payload in replayed}

    @property
    def last_seq(self) -> int | None:
        """The sequence number of the last batch delivered (or skipped as lost)."""
        return self._last

    def rewind(self, seq: int = 0) -> None:
        """Deliver again from ``seq`` on: the next live batch first replays ``seq`` onwards.

        For a consumer whose applied state was lost (its index was reset) and is rebuilt from
        the publisher's replay buffer. Batches no longer buffered are counted in the first
        delivery's ``lost_before``; without a replay endpoint all of them are.
        """
        if type(seq) is not int or seq < 0:
            raise InvalidArgument(f"seq must be an integer >= 0, got {seq!r}", field="seq")
        self._last = seq - 1
        self._positioned = False

    async def recv(self) -> Delivery:
        """Return the next batch in order, replaying missed ones first."""
        if self._sub is None:
            raise FailedPrecondition("subscriber is not started; call `await sub.start()`")
        while not self._pending:
            if self._accepting is None:
                frames = await self._sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    self.stats.malformed_messages += 1
                    continue
                try:
                    topic = frames[0].decode("utf-8")
                except UnicodeDecodeError:
                    self.stats.malformed_messages += 1
                    continue
                seq = int.from_bytes(frames[1], "big")
                if self._echo:
                    if self._echo.get(seq) == frames[2]:
                        continue  # published after the subscription took effect: replayed too
                    self._echo.clear()
                restarted, expected = self._position(seq)
                if seq <= expected or self.replay_endpoint is None:
                    self._deliver(topic, seq, frames[2], restarted, expected, [])
                    continue
                self._accepting = asyncio.ensure_future(
                    self._replay_then_deliver(topic, seq, frames[2], restarted, expected)
                )
            # A caller's timeout must not abandon a replay half way (its replies would leak
            # into the next one): the replay runs on and the next recv() picks it up.
            accepting = self._accepting
            try:
                await asyncio.shield(accepting)
            finally:
                if accepting.done():
                    self._accepting = None
        return self._pending.popleft()

    def __aiter__(self) -> ZmqEventSubscriber:
        return self

    async def __anext__(self) -> Delivery:
        return await self.recv()

    def _position(self, seq: int) -> tuple[bool, int]:
        """Return (publisher restarted?, the seq expected next) for an arriving ``seq``."""
        if self._last is not None and seq <= self._last:
            self.stats.restarts += 1
            return True, 0
        return False, seq if self._last is None else self._last + 1

    async def _replay_then_deliver(
        self, topic: str, seq: int, payload: bytes, restarted: bool, expected: int
    ) -> None:
        replayed = await self._replay(expected, seq, topic)
        self._deliver(topic, seq, payload, restarted, expected, replayed)

    def _deliver(
        self,
        topic: str,
        seq: int,
        payload: bytes,
        restarted: bool,
        expected: int,
        replayed: list[tuple[str, int, bytes]],
        *,
        replayed_last: bool = False,
    ) -> None:
        """Queue the replayed batches, then the last one (live, or itself replayed when
        ``replayed_last``), noting what stayed missing."""
        prev = expected - 1
        if not self._positioned:
            # The first delivery since start (or a rewind): this subscriber held no position,
            # so nothing before it is missing to it (a restart-safe publisher's run begins far
            # above 0; an older one may have left the buffer: a consumer starting from it
            # under-reports, never over-reports).
            prev = (replayed[0][1] if replayed else seq) - 1
            self._positioned = True
        for r_topic, r_seq, r_payload in replayed:
            lost = r_seq - prev - 1
            self._pending.append(Delivery(r_topic, r_seq, r_payload, True, restarted, lost))
            self.stats.replayed += 1
            self.stats.lost += lost
            restarted = False
            prev = r_seq
        self.stats.lost += seq - prev - 1
        self._pending.append(
            Delivery(topic, seq, payload, replayed_last, restarted, seq - prev - 1)
        )
        if replayed_last:
            self.stats.replayed += 1
        else:
            self.stats.received += 1
        self._last = seq

    async def _replay(self, start: int, stop: int, topic: str) -> list[tuple[str, int, bytes]]:
        """Fetch batches start..stop-1 from the replay socket (those still buffered)."""
        if self.replay_endpoint is None:
            return []
        self.stats.replay_requests += 1
        if self._dealer is None:
            dealer = zmq.asyncio.Context(shadow=self._ctx).socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.replay_endpoint)
            self._dealer = dealer
        got: dict[int, tuple[str, int, bytes]] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._replay_timeout
        try:
            await self._dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                frames = await asyncio.wait_for(
                    self._dealer.recv_multipart(), max(0.0, deadline - loop.time())
                )
                if len(frames) == 4 and frames[0] == b"":  # vLLM >= 0.26: with topic
                    _, r_topic_b, seq_b, payload = frames
                elif len(frames) == 3 and frames[0] == b"":  # vLLM <= 0.25: no topic
                    _, seq_b, payload = frames
                    r_topic_b = topic.encode("utf-8")
                else:
                    self.stats.malformed_messages += 1
                    continue
                if seq_b == END_SEQ:
                    break
                r_seq = int.from_bytes(seq_b, "big")
                if start <= r_seq < stop and len(seq_b) == 8:
                    r_topic = r_topic_b.decode("utf-8", errors="replace")
                    got[r_seq] = (r_topic, r_seq, payload)
        except (asyncio.TimeoutError, zmq.ZMQError) as exc:
            # Late replies must not leak into the next request: drop this DEALER.
            self.stats.replay_failures += 1
            log.warning("KV-event replay from %d failed: %r", start, exc)
            self._dealer.close(linger=0)
            self._dealer = None
        return [got[s] for s in sorted(got)]

    async def close(self) -> None:
        """Close both sockets (idempotent)."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(BaseException):
                await self._accepting
            self._accepting = None
        for sock in (self._sub, self._dealer):
            if sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.close(linger=0)
        self._sub = None
        self._dealer = None

    async def __aenter__(self) -> ZmqEventSubscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
