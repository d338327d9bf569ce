"""The relay's test-only fault (``engine/vllm/fault.py``): inert unless its file exists, and
then only for batches that remove a block."""

from __future__ import annotations

from tokenkeys.engine.vllm.fault import TEST_DROP, fault_drops
from tokenkeys.events.model import BlockRemoved, BlockStored, EventBatch

STORED = BlockStored(block_hashes=(1,), parent_block_hash=None, token_ids=(), block_size=16)
REMOVING = EventBatch(1.0, (STORED, BlockRemoved(block_hashes=(2,))))
STORING = EventBatch(1.0, (STORED,))


def test_the_fault_drops_only_removals_and_only_while_its_file_exists(tmp_path, monkeypatch):
    monkeypatch.delenv(TEST_DROP, raising=False)
    assert not fault_drops(REMOVING)  # unset: never
    path = tmp_path / "drop"
    monkeypatch.setenv(TEST_DROP, str(path))
    assert not fault_drops(REMOVING)  # set, no file: off
    path.touch()
    assert fault_drops(REMOVING) and not fault_drops(STORING)
    path.unlink()
    assert not fault_drops(REMOVING)
