"""A test-only fault of the sidecar's relay, never set in production.

While the file the environment variable :data:`TEST_DROP` names exists, the relay keeps every
vLLM batch that removes a block from its subscribers (no gap in their numbering: lost without a
trace) while its ledger, the snapshot's source, still applies it: the stale index a relay bug
leaves behind, for the stale-worker repair's real-engine test
(``tests/realengine/test_vllm_explain.py``). Unset, it costs one environment lookup per batch.
"""

from __future__ import annotations

import os

from tokenkeys.events.model import BlockRemoved, EventBatch

#: The environment variable naming the file that switches the fault on.
TEST_DROP = "TOKENKEYS_TEST_DROP_REMOVAL_BATCHES"


def fault_drops(batch: EventBatch) -> bool:
    """The fault is on and ``batch`` removes a block."""
    path = os.environ.get(TEST_DROP)
    if not path or not os.path.exists(path):
        return False
    return any(isinstance(e, BlockRemoved) for e in batch.events)
