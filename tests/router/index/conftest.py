"""The in-memory index's tests run twice: on the compiled key table and on the pure-Python one."""

from __future__ import annotations

import pytest
from evidence import select_core

from tokenkeys.router.index import table


@pytest.fixture(params=["C", "python"])
def table_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``C``: the compiled ``KeyTable`` (skipped where not built, failed under CI); ``python``:
    the ``PyKeyTable`` a platform without a compiler runs, in the same process."""
    return select_core(table, request.param, monkeypatch, "key table tokenkeys.router.index._table")
