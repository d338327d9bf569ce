"""smg's VllmEngine stubs for the tests: the package's own, from the installed smg-grpc-proto.

The tests import the stubs the way ``serve --vllm-engine-face`` does
(:mod:`tokenkeys.server.grpc.vllm_engine.stubs`, from the pinned ``smg-grpc-proto`` the
``smg`` and ``test`` extras install): one source, nothing compiled. Without that release the
calling module is skipped naming the install command, or fails under CI (tests/evidence.py).
"""

from __future__ import annotations

import pytest
from evidence import under_ci

from tokenkeys.errors import ConfigError


def require_smg_stubs() -> None:
    """Make the stubs importable from ``tokenkeys.server.grpc.vllm_engine.stubs``, or skip
    the calling module (fail it under CI: the test extra installs smg-grpc-proto)."""
    try:
        import tokenkeys.server.grpc.vllm_engine.stubs  # noqa: F401
    except ConfigError as exc:
        if under_ci():
            pytest.fail(f"a required part is unavailable under CI=true: {exc}", pytrace=False)
        pytest.skip(str(exc), allow_module_level=True)
