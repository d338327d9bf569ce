"""The key tests run twice where keys are computed: through the compiled core and without it."""

from __future__ import annotations

import pytest
from evidence import unavailable

from tokenkeys.keys import native


@pytest.fixture(params=["C", "python"])
def key_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``C``: the compiled chains (skipped where not built, failed under CI); ``python``: the
    pure-Python paths a platform without a compiler runs, in the same process."""
    if request.param == "python":
        monkeypatch.setattr(native, "CORE", None)
    elif native.CORE is None:
        unavailable(
            "the compiled key core tokenkeys.keys._chains is not built here "
            f"({native.describe()}): `python3 setup.py build_ext --inplace` builds it"
        )
    return request.param
