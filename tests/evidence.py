"""What a run proved with real parts, and what it may not skip.

The real-engine and peer tiers are the suite's evidence: a vLLM, Dynamo, smg or SGLang
environment that cannot be built must not turn a run green by skipping them. Outside CI (a
laptop without the torch wheel, a machine without Node.js) a missing part skips with its reason;
under CI (``CI`` set to a true value, as ``.ci/run`` and every CI service set it) the same
missing part fails the test with that reason, the build log's tail included.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import NoReturn

import pytest

_TRUE = ("1", "true", "yes", "on")


def under_ci() -> bool:
    """Whether this run is CI's: ``CI`` is set to a true value."""
    return os.environ.get("CI", "").strip().lower() in _TRUE


def unavailable(reason: str) -> NoReturn:
    """Skip the calling test for a part this machine lacks; under CI, fail it instead.

    ``reason`` names the part and why it is missing (the failing build step and its log's tail,
    the package to install), so the failure says what to fix.
    """
    if under_ci():
        pytest.fail(f"a required part is unavailable under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def select_core(switch: ModuleType, param: str, monkeypatch: pytest.MonkeyPatch, what: str) -> str:
    """Run the calling test on a compiled core or on the pure-Python path it replaces.

    ``switch`` is the module holding the core (``CORE``, ``describe()``); ``param`` "python"
    sets ``CORE`` to None for the test, "C" needs it built (:func:`unavailable` otherwise;
    ``what`` names the extension for that message).
    """
    if param == "python":
        monkeypatch.setattr(switch, "CORE", None)
    elif switch.CORE is None:
        unavailable(
            f"the compiled {what} is not built here ({switch.describe()}): "
            "`python3 setup.py build_ext --inplace` builds it"
        )
    return param
