"""One engine's KV-event stream: numbers batches once and fans them out to ZMQ and to in-process
subscribers (the gRPC ``SubscribeKvEvents`` stream), so every transport carries the same batches
under the same sequence numbers.

With ``snapshot_on_join`` (``--kv-events-join-snapshot``; off by default), a ZMQ subscriber
that joins is answered as follows. A ZMQ subscriber that joins (or rejoins after its publisher
restarted) receives only what is
published after ZMQ attached it: a restarted engine's opening ``AllBlocksCleared`` is lost to a
subscriber that stayed connected across the restart and had not reconnected yet, and one that
never replays keeps the old run's blocks for good. So the stream answers every join its
publisher reports (``ZmqEventPublisher.on_join``) with its snapshot as an ordinary batch of the
stream: ``AllBlocksCleared``, then one ``BlockStored`` per block cached now. Applying it leaves
a consumer that was in step where it was, and puts one that missed the clear (or joined late)
in step; a snapshot never names a block the engine does not hold (``events.snapshot``), so it
never makes a consumer over-promise. Joins arriving together get one snapshot. It is off by
default: the snapshot is as large as the cache and goes to every subscriber, and it is not yet
proven against vLLM's hybrid models (several KV-cache groups). The ledger keeps groups apart
(``events.snapshot``), but tests/realengine/test_vllm_hybrid.py, which failed with it on,
compares relayed events whole against vLLM's, and a snapshot's stores are one block each.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator

from tokenkeys.errors import ConfigError, FailedPrecondition, LimitExceeded
from tokenkeys.events.model import EventBatch, EventSourceInfo, SpecRef
from tokenkeys.events.snapshot import BlockLedger, Snapshot
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_publisher import ZmqEventPublisher


class _Subscription:
    def __init__(self, limit: int) -> None:
        self.items: deque[tuple[int, EventBatch]] = deque()
        self.wake = asyncio.Event()
        self.limit = limit
        self.overflow = False


class EventStream:
    """Sequence, stamp and fan out event batches; usable directly as an engine's event sink.

    Each batch gets ``spec`` and ``data_parallel_rank`` stamped on, is encoded with ``codec`` and
    published on ``publisher`` when one is given (the publisher's sequence number is then the
    stream's; without one the stream counts from ``first_seq``), and is kept in a bounded
    buffer for :meth:`subscribe`. Call from the event loop.
    """

    def __init__(
        self,
        spec: SpecRef,
        *,
        publisher: ZmqEventPublisher | None = None,
        codec: VllmMsgpackCodec | None = None,
        data_parallel_rank: int = 0,
        buffer_steps: int = 10_000,
        subscriber_backlog: int = 10_000,
        first_seq: int = 0,
        snapshot_on_join: bool = False,
    ) -> None:
        for name, value in (("buffer_steps", buffer_steps), ("backlog", subscriber_backlog)):
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}", field=name)
        self.spec = spec
        self.publisher = publisher
        self.codec = codec or VllmMsgpackCodec()
        self.data_parallel_rank = data_parallel_rank
        self._buffer: deque[tuple[int, EventBatch]] = deque(maxlen=buffer_steps)
        self._backlog = subscriber_backlog
        self._subs: set[_Subscription] = set()
        self._next_seq = publisher.next_seq if publisher is not None else first_seq
        #: The sequence number of the stream's first batch.
        self.first_seq = self._next_seq
        self._closed = False
        #: The blocks this stream says are cached (``events.snapshot``), for late joiners.
        self.ledger = BlockLedger()
        #: Snapshots published because a ZMQ subscriber joined (see the module doc).
        self.join_snapshots = 0
        self._join_pending = False
        if publisher is not None and snapshot_on_join:
            publisher.on_join = self._joined

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch gets."""
        return self._next_seq

    def source_info(self) -> EventSourceInfo | None:
        """What discovery advertises for the ZMQ side of this stream (None without ZMQ).

        Call after ``await publisher.start()`` so the addresses are the resolved, routable ones.
        """
        pub = self.publisher
        if pub is None:
            return None
        return EventSourceInfo(
            endpoint=pub.endpoint,
            topic=pub.topic,
            spec=self.spec,
            replay_endpoint=pub.replay_endpoint,
            data_parallel_rank=self.data_parallel_rank,
            wire_version=self.codec.version,
        )

    def __call__(self, batch: EventBatch) -> int:
        """Publish one batch (the engine's sink); return its sequence number."""
        return self.emit(batch)

    def emit(self, batch: EventBatch) -> int:
        """Stamp, encode, publish and fan out ``batch``; return its sequence number."""
        rank = batch.data_parallel_rank
        batch = dataclasses.replace(
            batch,
            spec=self.spec,
            data_parallel_rank=self.data_parallel_rank if rank is None else rank,
        )
        if self.publisher is not None:
            seq = self.publisher.publish(self.codec.encode(batch))
        else:
            seq = self._next_seq
        self._next_seq = seq + 1
        self.ledger.apply(batch)
        self._buffer.append((seq, batch))
        for sub in self._subs:
            if len(sub.items) >= sub.limit:
                sub.overflow = True
            elif not sub.overflow:
                sub.items.append((seq, batch))
            sub.wake.set()
        return seq

    def snapshot(self) -> Snapshot:
        """The blocks cached now, valid at :attr:`next_seq` (follow from there)."""
        snap = self.ledger.snapshot(self._next_seq)
        batch = dataclasses.replace(
            snap.batch, spec=self.spec, data_parallel_rank=self.data_parallel_rank
        )
        return dataclasses.replace(snap, batch=batch)

    def _joined(self) -> None:
        """A ZMQ subscriber joined: publish the snapshot once the loop has read the joins that
        arrived with it."""
        if not self._join_pending:
            self._join_pending = True
            asyncio.get_running_loop().call_soon(self._publish_snapshot)

    def _publish_snapshot(self) -> None:
        self._join_pending = False
        # A join read just before the publisher closed finds nothing left to publish on.
        if not self._closed and self.publisher is not None and self.publisher.running:
            self.join_snapshots += 1
            self.emit(self.snapshot().batch)

    async def subscribe(
        self, start_seq: int | None = None
    ) -> AsyncIterator[tuple[int, EventBatch]]:
        """Yield (seq, batch) in order: buffered ones from ``start_seq`` on, then live ones.

        With ``start_seq=None`` only live batches come; a future ``start_seq`` waits for it.
        A ``start_seq`` older than the buffer
        starts at the oldest buffered batch (the first seq shows the gap, as in vLLM's replay).
        A subscriber that falls ``subscriber_backlog`` batches behind gets its buffered items
        and then :class:`~tokenkeys.errors.LimitExceeded`; it resubscribes from the next seq.
        """
        sub = _Subscription(self._backlog)
        backlog = [] if start_seq is None else [i for i in self._buffer if i[0] >= start_seq]
        self._subs.add(sub)
        async for item in self._follow(sub, backlog, start_seq or 0):
            yield item

    async def subscribe_from_snapshot(
        self, *, require_complete: bool = True
    ) -> AsyncIterator[tuple[int, EventBatch]]:
        """Yield the :meth:`snapshot` as one batch, then every batch from its ``next_seq`` on.

        The snapshot is numbered ``next_seq - 1``: it holds the effect of every batch up to
        that one and of none after, so the numbers a consumer sees stay contiguous and a gap
        still means a loss. It is taken and the subscription registered in one step of the
        event loop, so no batch falls between them. ``require_complete``: a snapshot that
        may lack blocks (a relay that joined its publisher late, ``events.snapshot``) raises
        :class:`~tokenkeys.errors.FailedPrecondition` naming why, instead of passing for the
        whole cache.
        """
        snap = self.snapshot()
        if require_complete and not snap.complete:
            raise FailedPrecondition(
                f"the KV-event snapshot is not complete: {snap.reason}; subscribe without "
                "the snapshot, or ask GetKvSnapshot (it says what the snapshot lacks)",
                field="include_snapshot",
            )
        if snap.next_seq == 0:
            raise FailedPrecondition(
                "the KV-event stream has published nothing yet, so a snapshot has no number; "
                "subscribe from sequence 0 instead",
                field="include_snapshot",
            )
        sub = _Subscription(self._backlog)
        self._subs.add(sub)
        follow = self._follow(sub, [], snap.next_seq)
        try:
            yield snap.next_seq - 1, snap.batch
        except BaseException:
            self._subs.discard(sub)  # the follower never started, its finally never runs
            raise
        async for item in follow:
            yield item

    async def _follow(
        self, sub: _Subscription, backlog: list[tuple[int, EventBatch]], floor: int
    ) -> AsyncIterator[tuple[int, EventBatch]]:
        """The backlog, then what ``emit`` queues on the registered ``sub`` from ``floor``."""
        try:
            for item in backlog:
                yield item
            while True:
                while sub.items:
                    item = sub.items.popleft()
                    if item[0] >= floor:
                        yield item
                if sub.overflow:
                    raise LimitExceeded(
                        f"KV-event subscriber fell more than {self._backlog} batches behind; "
                        "resubscribe with start_seq set to the next sequence number you need",
                        field="start_seq",
                    )
                if self._closed:
                    return
                sub.wake.clear()
                await sub.wake.wait()
        finally:
            self._subs.discard(sub)

    def close(self) -> None:
        """End every subscription after its pending batches."""
        self._closed = True
        for sub in self._subs:
            sub.wake.set()
