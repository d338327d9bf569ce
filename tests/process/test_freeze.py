"""What a serving process does with what it built at start: frozen out of full collections."""

from __future__ import annotations

import gc

import pytest

from tokenkeys.process.run import freeze_started
from tokenkeys.router.index import table
from tokenkeys.router.index.memory import MemoryPrefixIndex


async def test_an_index_built_before_the_freeze_is_out_of_full_collections_as_it_grows(
    monkeypatch: pytest.MonkeyPatch,
):
    # The pure-Python table (an OrderedDict) is tracked; the compiled one never is
    # (tests/router/index/test_index_memory.py).
    monkeypatch.setattr(table, "CORE", None)
    index = MemoryPrefixIndex()
    assert any(o is index._table for o in gc.get_objects())  # tracked, walked by full passes
    try:
        freeze_started()
        await index.add("w", list(range(10_000)))
        assert gc.get_freeze_count() > 0
        assert not any(o is index._table for o in gc.get_objects())
    finally:
        gc.unfreeze()  # the rest of the suite collects as usual
