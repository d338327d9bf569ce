"""Publish KV-event payloads over ZMQ the way vLLM does, and answer replay requests.

Matches vLLM 0.33 ``ZmqEventPublisher`` (`vllm/distributed/kv_events.py`):

- PUB socket; one three-frame message per batch: ``[topic utf-8, seq (8 bytes big-endian),
  payload]``, ``seq`` counting up from ``first_seq`` (vLLM: 0 for each publisher process).
  tokenkeys binds an XPUB (the same wire to a SUB) so that it learns when a subscriber joins:
  each subscription that covers the topic (sent by a SUB when it connects and again each time
  it reconnects, ``XPUB_VERBOSE`` so that none is folded into an earlier one) calls
  :attr:`ZmqEventPublisher.on_join` once it is attached, so what is published from then on
  reaches that subscriber. ZMQ's slow joiner loses whatever is published before: a restarted
  engine's opening ``AllBlocksCleared`` to a subscriber still reconnecting. The stream answers
  a join with its snapshot (``events.stream``).

A publisher whose sequence starts at 0 again after a restart looks to its consumers like an old
stream going back: Dynamo's indexer drops the new batches until they pass the old maximum,
smg's relay ends its stream with DATA_LOSS. tokenkeys' engines therefore start at
:func:`restart_safe_first_seq`, a sequence a restarted publisher never goes below (see
``docs/integrations.md``, "Restarts").
- ROUTER replay socket: a request ``[client_id, b"", start_seq (8 bytes BE)]`` is answered with
  ``[client_id, b"", topic, seq, payload]`` for every buffered batch whose seq >= start_seq, then
  the end marker ``[client_id, b"", b"", ff*8, b""]``; the buffer keeps the last
  ``buffer_steps`` batches. vLLM 0.10 to 0.25 send no topic frame in replies (``[client_id,
  b"", seq, payload]``, end ``[client_id, b"", ff*8, b""]``): ``replay_topic=False`` answers
  so (:data:`~tokenkeys.events.vllm_codec.REPLAY_TOPIC_SINCE`).

This module only moves bytes: payloads are encoded elsewhere (``vllm_codec``). It is built for an
asyncio server: :meth:`publish` is a plain non-blocking call made from the event loop thread
(PUB never blocks; at its high-water mark ZMQ drops, as in vLLM), and replay requests are served
by a task on the same loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from tokenkeys.errors import ConfigError, FailedPrecondition, Unavailable
from tokenkeys.events.zmq_endpoint import bind, check_endpoint, is_wildcard, routable_endpoint

log = logging.getLogger(__name__)

#: Sequence frame of the replay end marker: vLLM's ``(-1).to_bytes(8, "big", signed=True)``.
END_SEQ = b"\xff" * 8
#: Seconds between reads of the subscriptions the XPUB queued (how soon a join is answered).
JOIN_POLL_S = 0.05
#: Sequence numbers stay below this (consumers read them as signed 64-bit, vLLM's end marker
#: is -1).
MAX_SEQ = 2**63 - 1


def restart_safe_first_seq(now_ns: int | None = None) -> int:
    """The first sequence number of a publisher that must never go back across restarts.

    The wall clock in microseconds: a run started later starts above every sequence number an
    earlier run used, as long as that run published less than one batch per microsecond on
    average (engines publish at most a few thousand a second) and the clock was not set back
    by more than the time between the two starts. Nothing is stored, so it holds for a
    process that restarts anywhere, on the same endpoint or not.
    """
    return (time.time_ns() if now_ns is None else now_ns) // 1000


@dataclass
class PublisherStats:
    """Counters of a publisher's work."""

    published: int = 0
    replay_requests: int = 0
    replayed_batches: int = 0
    bad_replay_requests: int = 0
    #: Subscriptions received (any topic), and those covering this publisher's topic.
    subscriptions: int = 0
    joins: int = 0


class ZmqEventPublisher:
    """PUB/ROUTER publisher of already-encoded KV-event payloads with a bounded replay buffer.

    ``endpoint`` is bound (default) or, with ``connect=True``, connected to a subscriber that
    binds. ``replay_endpoint`` (bound) enables replay. ``advertise_host`` replaces the host of
    the advertised addresses; a wildcard bind without it advertises this machine's primary IP.
    Call :meth:`start` inside the event loop before :meth:`publish`, :meth:`close` at the end.
    """

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:0",
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        advertise_host: str | None = None,
        connect: bool = False,
        context: zmq.Context | None = None,
        replay_topic: bool = True,
        first_seq: int = 0,
    ) -> None:
        check_endpoint(endpoint, "endpoint")
        if replay_endpoint is not None:
            check_endpoint(replay_endpoint, "replay_endpoint")
        if connect and is_wildcard(endpoint):
            raise ConfigError(
                f"cannot connect the PUB socket to wildcard {endpoint!r}; give the subscriber's "
                "address or bind instead (connect=False)",
                field="endpoint",
            )
        for name, value in (("buffer_steps", buffer_steps), ("hwm", hwm)):
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}", field=name)
        if not 0 <= first_seq < MAX_SEQ:
            raise ConfigError(
                f"first_seq must be in 0..{MAX_SEQ - 1}, got {first_seq}", field="first_seq"
            )
        self.topic = topic
        self._topic_bytes = topic.encode("utf-8")
        # The frames a replay reply starts with after [client_id, b""]: the topic, or none.
        self._replay_head: tuple[bytes, ...] = (self._topic_bytes,) if replay_topic else ()
        self._requested = (endpoint, replay_endpoint)
        self._connect = connect
        self._hwm = hwm
        self._buffer_steps = buffer_steps
        self._advertise_host = advertise_host
        self._ctx = context or zmq.Context.instance()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = first_seq
        self._pub: zmq.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self._join_task: asyncio.Task[None] | None = None
        #: Called (from the event loop) when a subscriber of this topic joins or rejoins.
        self.on_join: Callable[[], object] | None = None
        self._closed = False
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.stats = PublisherStats()

    async def start(self) -> None:
        """Open the sockets and start serving replays; resolves the advertised addresses."""
        if self._pub is not None:
            return
        self._closed = False
        endpoint, replay_endpoint = self._requested
        try:
            # A plain socket: publish() stays one non-blocking call; the subscriptions it
            # queues are read by a task polling every JOIN_POLL_S (one socket, one reader).
            pub = self._ctx.socket(zmq.XPUB)
            self._pub = pub
            pub.set_hwm(self._hwm)
            pub.setsockopt(zmq.LINGER, 0)
            pub.setsockopt(zmq.XPUB_VERBOSE, 1)
            if self._connect:
                pub.connect(endpoint)
                self.endpoint = endpoint
            else:
                await bind(pub, endpoint)
                self.endpoint = routable_endpoint(_last_endpoint(pub), self._advertise_host)
            self._pub = pub
            self._join_task = asyncio.get_running_loop().create_task(
                self._watch_joins(pub), name="kv-events-joins"
            )
            if replay_endpoint is not None:
                # Owned by an asyncio view of the same context (a wrapped sync socket would
                # close the handle when garbage collected).
                router = zmq.asyncio.Context(shadow=self._ctx).socket(zmq.ROUTER)
                self._router = router
                # vLLM sizes the replay HWM so a full buffer plus end marker fits.
                router.setsockopt(zmq.SNDHWM, 2 * (self._buffer_steps + 1))
                router.setsockopt(zmq.LINGER, 0)
                await bind(router, replay_endpoint)
                self.replay_endpoint = routable_endpoint(
                    _last_endpoint(router), self._advertise_host
                )
                self._replay_task = asyncio.get_running_loop().create_task(
                    self._serve_replay(), name="kv-events-replay"
                )
        except zmq.ZMQError as exc:
            await self.close()
            raise Unavailable(
                f"cannot open KV-event sockets at {endpoint!r} / {replay_endpoint!r}: {exc}; "
                "choose a free port (tcp://HOST:0 picks one)",
                field="endpoint",
            ) from exc

    @property
    def running(self) -> bool:
        """Whether :meth:`publish` may be called (started and not closed)."""
        return self._pub is not None and not self._closed

    @property
    def next_seq(self) -> int:
        """The sequence number the next published batch gets."""
        return self._next_seq

    def publish(self, payload: bytes) -> int:
        """Send one encoded batch and keep it for replay; return its sequence number."""
        if self._pub is None or self._closed:
            raise FailedPrecondition(
                "KV-event publisher is not running; call `await publisher.start()` first "
                "(and do not publish after close())"
            )
        seq = self._next_seq
        self._next_seq += 1
        try:
            self._pub.send_multipart(
                (self._topic_bytes, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK
            )
        except zmq.Again:
            # Only on a connect-mode PUB with no peer yet; vLLM's PUB drops in that case too.
            log.debug("KV-event batch %d dropped: no subscriber reachable", seq)
        self._buffer.append((seq, payload))
        self.stats.published += 1
        return seq

    def buffered(self) -> list[tuple[int, bytes]]:
        """Return a copy of the replay buffer as (seq, payload), oldest first."""
        return list(self._buffer)

    async def _watch_joins(self, pub: zmq.Socket) -> None:
        """Call :attr:`on_join` for each subscription covering the topic (see the module doc),
        reading what the XPUB queued every :data:`JOIN_POLL_S` seconds."""
        while True:
            await asyncio.sleep(JOIN_POLL_S)
            while True:
                try:
                    message = pub.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:
                    if self._closed:
                        return
                    log.warning("KV-event subscription read failed: %s", exc)
                    break
                # b"\x01" + prefix subscribes (b"\x00" unsubscribes); a SUB filtering on a
                # prefix of the topic receives it.
                if message[:1] != b"\x01":
                    continue
                self.stats.subscriptions += 1
                if self._topic_bytes.startswith(message[1:]):
                    self.stats.joins += 1
                    if self.on_join is not None:
                        self.on_join()

    async def _serve_replay(self) -> None:
        assert self._router is not None
        router = self._router
        while True:
            try:
                frames = await router.recv_multipart()
                if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                    self.stats.bad_replay_requests += 1
                    log.warning(
                        "ignoring malformed KV-event replay request of %d frames", len(frames)
                    )
                    continue
                client, _, start = frames
                start_seq = int.from_bytes(start, "big")
                self.stats.replay_requests += 1
                # Snapshot first: publish() may append while the sends below yield.
                pending = [(s, p) for s, p in self._buffer if s >= start_seq]
                head = self._replay_head
                for seq, payload in pending:
                    await router.send_multipart(
                        (client, b"", *head, seq.to_bytes(8, "big"), payload)
                    )
                self.stats.replayed_batches += len(pending)
                await router.send_multipart((client, b"", *(b"" for _ in head), END_SEQ, b""))
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as exc:
                if self._closed:
                    return
                log.warning("KV-event replay failed: %s", exc)

    async def close(self) -> None:
        """Stop serving replays and close the sockets (idempotent)."""
        self._closed = True
        for task in (self._replay_task, self._join_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._replay_task = self._join_task = None
        for sock in (self._router, self._pub):
            if sock is not None:
                sock.close(linger=0)
        self._router = None
        self._pub = None

    async def __aenter__(self) -> ZmqEventPublisher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _last_endpoint(sock: zmq.Socket) -> str:
    value = sock.getsockopt(zmq.LAST_ENDPOINT)
    return value.decode() if isinstance(value, bytes) else str(value)
