"""What the vLLM sidecar's snapshot claims to know, delivery by delivery (``snapshot_scope``).

Deliveries as the sidecar's ZMQ subscriber produces them (``events.zmq_subscriber.Delivery``);
the ledger is the stream's real one. The sidecar's relay end to end runs against a real vLLM in
``tests/realengine``.
"""

from __future__ import annotations

from tokenkeys.engine.vllm import snapshot_scope
from tokenkeys.events.model import BlockStored, EventBatch
from tokenkeys.events.snapshot import BlockLedger
from tokenkeys.events.zmq_subscriber import Delivery


def delivery(seq: int, **kw: object) -> Delivery:
    return Delivery("kv", seq, b"", **kw)  # type: ignore[arg-type]


def test_nothing_is_known_before_vllm_publishes():
    ledger = BlockLedger()
    snapshot_scope.before_first(ledger)
    snap = ledger.snapshot(0)
    assert not snap.complete and "before this sidecar started" in snap.reason


def test_a_stream_seen_from_vllms_first_batch_is_complete():
    ledger = BlockLedger()
    snapshot_scope.before_first(ledger)
    snapshot_scope.observe(ledger, delivery(0, replayed=True), first=True)
    snapshot_scope.observe(ledger, delivery(1), first=False)
    assert ledger.snapshot(2).complete


def test_batches_vllm_no_longer_buffers_make_it_partial_and_say_which():
    ledger = BlockLedger()
    snapshot_scope.before_first(ledger)
    snapshot_scope.observe(ledger, delivery(42, replayed=True), first=True)
    snap = ledger.snapshot(0)
    assert not snap.complete and "batches 0-41" in snap.reason


def test_a_gap_later_clears_what_may_be_stale_and_a_restart_starts_afresh():
    ledger = BlockLedger()
    snapshot_scope.observe(ledger, delivery(0), first=True)
    ledger.apply(EventBatch(0.0, (BlockStored((1, 2), None, (), 16),)))
    snapshot_scope.observe(ledger, delivery(9, lost_before=3), first=False)
    snap = ledger.snapshot(0)
    assert snap.blocks == 0 and not snap.complete and "3 of vLLM's" in snap.reason
    snapshot_scope.observe(ledger, delivery(0, restarted=True), first=False)
    assert ledger.snapshot(0).complete
