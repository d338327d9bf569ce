"""A subscription to smg-grpc-servicer's released KV-event relay
(``drivers/smg_kv_relay_driver.py``) over real gRPC: the batches it forwards, how its stream
ended, and the relay's own counters.

The client runs in a thread (grpc's blocking stub), so synchronous and asyncio tests use it
alike; :meth:`Subscription.close` cancels the stream and waits for the relay to report the
counters of it (its ``on_counts``, called as the stream closes).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
from conftest import PeerDriver

from smg_stubs import require_smg_stubs

require_smg_stubs()

from tokenkeys.server.grpc.vllm_engine.stubs import common_pb2, vllm_engine_pb2_grpc  # noqa: E402

# A safety net for the relay's own bookkeeping, not a measurement.
COUNTS_TIMEOUT_S = 120.0


class Subscription:
    """``SubscribeKvEvents`` from 0 on one relay server, read in a thread."""

    def __init__(self, peer: PeerDriver, endpoint: str, replay_endpoint: str | None) -> None:
        self.peer = peer
        server = peer.call("serve", endpoint=endpoint, replay_endpoint=replay_endpoint)
        self.index = server["index"]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{server['port']}")
        self.batches: list[Any] = []
        self.ended: grpc.StatusCode | None = None  # how the stream ended, if it did
        self.details = ""
        self._lock = threading.Lock()
        self._streams = 0
        self._subscribe()

    def _subscribe(self) -> None:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(self.channel)
        self.call = stub.SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(start_sequence_number=0)
        )
        self.call.initial_metadata()  # the relay has subscribed its ZMQ socket
        self._streams += 1
        self._reader = threading.Thread(target=self._read, args=(self.call,), daemon=True)
        self._reader.start()

    def _read(self, call) -> None:  # noqa: ANN001 - a grpc stream
        try:
            for batch in call:
                with self._lock:
                    self.batches.append(batch)
        except grpc.RpcError as exc:
            self.ended, self.details = exc.code(), exc.details() or ""

    def resubscribe(self) -> None:
        """What smg's gateway does after ``DATA_LOSS``: a new stream from 0."""
        self.ended, self.details = None, ""
        self._subscribe()

    def stored_blocks(self) -> list[Any]:
        """Every ``KvBlock`` stored in the batches forwarded so far, in order."""
        with self._lock:
            batches = list(self.batches)
        return [
            block
            for batch in batches
            for event in batch.events
            if event.HasField("stored")
            for block in event.stored.blocks
        ]

    def cleared(self) -> int:
        with self._lock:
            return sum(e.HasField("cleared") for b in self.batches for e in b.events)

    def counts(self) -> list[dict[str, Any]]:
        """The relay's counters of every stream of this subscription that has ended."""
        deadline = time.monotonic() + COUNTS_TIMEOUT_S
        while True:
            closed = self.peer.call("closed", index=self.index)
            if len(closed) == self._streams:
                return closed
            assert time.monotonic() < deadline, f"the relay reported {len(closed)} streams"
            time.sleep(0.1)

    def close(self) -> list[dict[str, Any]]:
        """Cancel the stream; the relay's counters of every stream."""
        self.call.cancel()
        self._reader.join(30)
        counts = self.counts()
        self.channel.close()
        return counts
