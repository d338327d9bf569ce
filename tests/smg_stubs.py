"""smg's VllmEngine stubs for the tests: built from the installed smg-grpc-proto when absent.

The face's stubs are compiled at build or test time, never committed
(``scripts/gen_smg_proto.py``). :func:`require_smg_stubs` builds them into the checkout's
ignored ``src/tokenkeys/_gen_smg`` when they are missing or from another release; without
smg-grpc-proto (test extra) the calling module is skipped naming the install command.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from support import REPO


def require_smg_stubs() -> None:
    """Make ``tokenkeys._gen_smg`` importable and current, or skip the calling module."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools (test extra) compiles the stubs")
    pytest.importorskip(
        "smg_grpc_proto", reason="smg-grpc-proto==0.4.28 (test extra) carries smg's protos"
    )
    spec = importlib.util.spec_from_file_location(
        "gen_smg_proto", REPO / "scripts" / "gen_smg_proto.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_smg_proto"] = module
    spec.loader.exec_module(module)
    try:
        current = importlib.import_module("tokenkeys._gen_smg").SOURCE_VERSION
    except ImportError:
        current = None
    if current != module.PINNED_VERSION:
        module.generate(module.DEFAULT_OUT)
        importlib.invalidate_caches()
