"""``tokenkeys pull`` and ``prune`` as subprocesses: quiet in pipes, a bar on a terminal, ^C."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faulty_streams import Stall, data_indices, leftovers, served

from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import Tokenizer, TokenizerOptions, default_tokenizer_path

from support import REPO, run_cli


@pytest.fixture
def server(grpc_server):  # noqa: ANN001, ANN201
    return grpc_server(load_models([ModelSource.default()], TokenizerOptions(), Limits()))


def test_pull_is_quiet_in_a_pipe_and_prints_the_folder(server, tmp_path: Path) -> None:  # noqa: ANN001
    cache = tmp_path / "cache"
    fp = server.models.get(None).tokenizer.fingerprint
    done = run_cli("pull", server.target, "--cache", str(cache))
    assert done.stdout == f"{cache / fp}\n" and done.stderr == ""
    again = json.loads(run_cli("pull", server.target, "--cache", str(cache), "--json").stdout)
    assert again["from_cache"] is True and again["transferred"] == 0
    assert again["fingerprint"] == fp and again["path"] == str(cache / fp)
    pruned = json.loads(run_cli("prune", "--cache", str(cache), "--json").stdout)
    assert pruned == {"removed": [], "kept": [fp], "dry_run": False}
    gone = run_cli("prune", "--cache", str(cache), "--all")
    assert gone.stdout == f"removed {fp}\n" and leftovers(cache) == []


def test_pull_errors_exit_2_with_one_line(tmp_path: Path, server) -> None:  # noqa: ANN001
    done = run_cli(
        "pull", server.target, "--cache", str(tmp_path), "--max-file-bytes", "1000", check=False
    )
    assert done.returncode == 2
    assert done.stderr.startswith("tokenkeys pull: error: tokenizer.json: 1759751 bytes is over")
    assert leftovers(tmp_path) == []
    done = run_cli("pull", server.target, "--model", "nope", "--cache", str(tmp_path), check=False)
    assert done.returncode == 2 and "served models: smollm2-135m-instruct" in done.stderr


def test_pull_draws_a_progress_bar_on_a_terminal(server, tmp_path: Path) -> None:  # noqa: ANN001
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    args = ["pull", server.target, "--cache", str(tmp_path), "--chunk-size", "65536"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkeys.cli", *args],
        stdout=subprocess.PIPE,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            block = os.read(leader, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not block:
            break
        shown += block
    proc.wait(60)
    os.close(leader)
    text = shown.decode()
    assert proc.returncode == 0
    assert "tokenizer.json [" in text and "/ 1.8 MB" in text and "MB/s" in text
    assert "########################] 1.8 MB / 1.8 MB" in text
    fp = server.models.get(None).tokenizer.fingerprint
    assert f"{fp} (1.8 MB in " in text


def _written(cache: Path, name: str) -> int:
    """Bytes of ``name`` written so far in the cache's partial folder (files are unbuffered)."""
    return sum(p.stat().st_size for p in cache.rglob(name)) if cache.exists() else 0


def _asleep(pid: int) -> bool:
    """Whether the process's main thread is waiting (state S in ``/proc/PID/stat``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "S"


@pytest.mark.xfail(
    strict=False,
    reason="known fault under investigation: in 2 of the last 3 clean-clone runs the pull did "
    "not exit within 30 s of a SIGINT at the stall (passes when run alone)",
)
def test_interrupt_leaves_nothing(grpc_server, tmp_path: Path) -> None:  # noqa: ANN001
    tokenizer = Tokenizer.load(default_tokenizer_path())

    def stall(messages, call):  # noqa: ANN001, ANN202
        cut = data_indices(messages)[2]
        return [*messages[:cut], Stall(60), *messages[cut:]]

    registry, _ = served(tokenizer, stall)
    target = grpc_server(registry).target
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkeys.cli", "pull", target, "--cache", str(cache)]
        + ["--chunk-size", "65536"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 30  # a safety net, not a criterion
    # Until both chunks before the stall are written and the pull waits for the next one: its
    # main thread asleep once they are on disk is past its progress report of them (between a
    # chunk's write and its report it only computes), so the message below is determined.
    while not (_written(cache, "tokenizer.json") >= 131072 and _asleep(proc.pid)):
        assert time.monotonic() < deadline, "the pull never reached the stall"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert out == ""
    assert err == (
        "tokenkeys pull: interrupted at tokenizer.json (131072 of 1760640 bytes); "
        "nothing was installed\n"
    )
    assert leftovers(cache) == []
