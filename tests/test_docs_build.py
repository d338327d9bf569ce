"""The reference documentation (Python package and proto) builds with one command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO


def test_reference_docs_build(tmp_path: Path) -> None:
    pytest.importorskip("pdoc", reason="pdoc (test extra) builds the Python reference")
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_docs.py"), "--out", str(tmp_path)],
        check=True,
        timeout=300,
    )
    proto = (tmp_path / "proto.md").read_text()
    for name in ("service OpenEngineTokenizer", "message TokenizeRequest", "enum NulHandling"):
        assert name in proto
    assert "Unset: the server default" in proto
    assert (tmp_path / "python" / "tokenkeys.html").exists()
    assert (tmp_path / "python" / "tokenkeys" / "preprocess.html").exists()
