"""The tree is formatted and linted with ruff, as the house conventions require."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from support import REPO

PATHS = ["src", "tests", "bench", "scripts"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff(command: list[str]) -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff (test extra) is not installed")
    result = subprocess.run(
        [ruff, *command, *PATHS], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
