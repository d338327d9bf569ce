"""The key tests run twice where keys are computed: through the compiled core and without it."""

from __future__ import annotations

import pytest
from evidence import select_core

from tokenkeys.keys import native


@pytest.fixture(params=["C", "python"])
def key_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``C``: the compiled chains (skipped where not built, failed under CI); ``python``: the
    pure-Python paths a platform without a compiler runs, in the same process."""
    return select_core(native, request.param, monkeypatch, "key core tokenkeys.keys._chains")
