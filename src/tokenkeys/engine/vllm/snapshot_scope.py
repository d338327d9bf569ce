"""What the sidecar of a vLLM knows of vLLM's cached blocks, for its snapshots.

The sidecar's event stream relays vLLM's (``engine.vllm.sidecar``), so its snapshot
(``events.snapshot``) holds what the relayed batches said, and no more. Exactly:

- Until the first batch arrives from vLLM the sidecar knows nothing of vLLM's cache (its ZMQ
  subscriber asks vLLM's replay buffer from sequence 0 only when a live batch shows up): the
  snapshot is empty and not ``complete``.
- A first batch numbered 0 (vLLM's first since its own start, live or replayed from its buffer
  of ``buffer_steps`` batches, 10,000 by default) means the sidecar saw every batch of this
  vLLM run: from then on the snapshot is ``complete``.
- A first batch numbered N > 0 means batches 0..N-1 were published before the sidecar started
  and vLLM no longer buffers them: blocks they stored that vLLM still holds are unknown (the
  snapshot lacks them; it never holds a block vLLM does not, since a block stored before N and
  removed later is simply removed). Not ``complete``.
- A gap later on (batches neither received nor replayable) may hide removals: the ledger is
  cleared (so it holds no block vLLM may have dropped) and stays not ``complete`` until vLLM
  restarts. A restart (vLLM's counter went back) clears it as well; the new run is then
  judged like the first.
"""

from __future__ import annotations

from tokenkeys.events.snapshot import BlockLedger
from tokenkeys.events.zmq_subscriber import Delivery

#: Why a sidecar's snapshot is partial before vLLM published anything it relayed.
NOT_YET = (
    "no KV-event batch relayed from vLLM yet: blocks vLLM stored before this sidecar started "
    "are unknown until vLLM publishes again"
)


def before_first(ledger: BlockLedger) -> None:
    """The sidecar starts: it knows nothing of vLLM's cache yet."""
    ledger.joined(False, NOT_YET)


def observe(ledger: BlockLedger, delivery: Delivery, *, first: bool) -> None:
    """Record what one delivery of vLLM's stream tells about the ledger's knowledge; call it
    before the delivery's batch is applied (``first``: the first delivery relayed)."""
    if first or delivery.restarted:
        if delivery.seq == 0:
            ledger.joined(True)
        else:
            ledger.joined(
                False,
                f"vLLM's KV-event batches 0-{delivery.seq - 1} were published before this "
                "sidecar started and are no longer in vLLM's replay buffer: blocks they "
                "stored are unknown",
            )
    elif delivery.lost_before:
        ledger.apply_clear()
        ledger.joined(
            False,
            f"{delivery.lost_before} of vLLM's KV-event batches were lost before batch "
            f"{delivery.seq}: the snapshot starts empty from there",
        )
