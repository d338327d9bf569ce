"""The checked-in generated code equals what scripts/gen_proto.py produces from proto/."""

from __future__ import annotations

import filecmp
import importlib.util
import sys
from pathlib import Path

import pytest

from support import REPO


def _files(root: Path) -> list[Path]:
    return sorted(
        p.relative_to(root) for p in root.rglob("*") if p.suffix in (".py", ".pyi") and p.is_file()
    )


def test_generated_code_is_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (test extra) regenerates the code")
    spec = importlib.util.spec_from_file_location("gen_proto", REPO / "scripts" / "gen_proto.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = module
    spec.loader.exec_module(module)
    module.generate(tmp_path / "_gen")
    checked_in = REPO / "src" / "tokenkeys" / "_gen"
    fresh = _files(tmp_path / "_gen")
    existing = _files(checked_in)
    assert fresh == existing, "run: python3 scripts/gen_proto.py"
    stale = [str(p) for p in fresh if not filecmp.cmp(tmp_path / "_gen" / p, checked_in / p, False)]
    assert not stale, f"stale generated files {stale}; run: python3 scripts/gen_proto.py"
