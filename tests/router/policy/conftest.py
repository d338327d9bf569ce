"""The policy's suites that go through the precise policy run twice: on the compiled ranking
and on the Python path."""

from __future__ import annotations

import pytest
from evidence import unavailable

from tokenkeys.router.policy import ranking


@pytest.fixture(params=["C", "python"])
def rank_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``C``: the compiled ranking (skipped where not built, failed under CI); ``python``: the
    Python path a platform without a compiler runs, in the same process."""
    if request.param == "python":
        monkeypatch.setattr(ranking, "CORE", None)
    elif ranking.CORE is None:
        unavailable(
            "the compiled ranking tokenkeys.router.policy._rank is not built here "
            f"({ranking.describe()}): `python3 setup.py build_ext --inplace` builds it"
        )
    return request.param
