"""The policy's suites that go through the precise policy run twice: on the compiled ranking
and on the Python path."""

from __future__ import annotations

import pytest
from evidence import select_core

from tokenkeys.router.policy import ranking


@pytest.fixture(params=["C", "python"])
def rank_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``C``: the compiled ranking (skipped where not built, failed under CI); ``python``: the
    Python path a platform without a compiler runs, in the same process."""
    return select_core(ranking, request.param, monkeypatch, "ranking tokenkeys.router.policy._rank")
