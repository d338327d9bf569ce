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


#: Runs the CLI as a terminal's shell starts a foreground command: with SIGINT at its default.
#: A child inherits an ignored SIGINT, and a suite started as a background job of a
#: non-interactive shell (``pytest &`` in a script) has it ignored: the pull would then rightly
#: keep ignoring Ctrl-C (tokenkeys.cli.interrupts) and this test would wait for nothing.
_AS_FROM_A_TERMINAL = """
import runpy, signal
signal.signal(signal.SIGINT, signal.default_int_handler)
{prelude}
runpy.run_module("tokenkeys.cli", run_name="__main__", alter_sys=True)
"""

#: Sends SIGINT from inside a weakref callback as soon as the CLI imports grpc, where Python's
#: own handler would raise KeyboardInterrupt into the callback and the interpreter would drop it
#: ("Exception ignored in ..."): the moment a hung pull had been interrupted at.
_SIGINT_IN_A_CALLBACK_DURING_IMPORTS = """
import sys, weakref

class SigintOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc":
            sys.meta_path.remove(self)
            dropped = type("Dropped", (), {})()
            held = weakref.ref(dropped, lambda _: signal.raise_signal(signal.SIGINT))  # called once
            del dropped
        return None

sys.meta_path.insert(0, SigintOnImport())
"""


def _pull(target: str, cache: Path, prelude: str = "") -> subprocess.Popen:
    """``tokenkeys pull TARGET`` in 64 KiB chunks into ``cache``, its output piped."""
    script = _AS_FROM_A_TERMINAL.format(prelude=prelude)
    return subprocess.Popen(
        [sys.executable, "-c", script, "pull", target, "--cache", str(cache)]
        + ["--chunk-size", "65536"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )


def test_interrupt_leaves_nothing(grpc_server, tmp_path: Path) -> None:  # noqa: ANN001
    tokenizer = Tokenizer.load(default_tokenizer_path())

    def stall(messages, call):  # noqa: ANN001, ANN202
        cut = data_indices(messages)[2]
        return [*messages[:cut], Stall(60), *messages[cut:]]

    registry, _ = served(tokenizer, stall)
    target = grpc_server(registry).target
    cache = tmp_path / "cache"
    proc = _pull(target, cache)
    # A safety net, not a criterion: at a load of about 10 on two cores the CLI's start and the
    # first two chunks once took over 30 s. The stall's 60 s count from the server's call.
    deadline = time.monotonic() + 90
    try:
        # Until both chunks before the stall are written and the pull waits for the next one:
        # its main thread asleep once they are on disk is past its progress report of them
        # (between a chunk's write and its report it only computes), so the message below is
        # determined.
        while not (_written(cache, "tokenizer.json") >= 131072 and _asleep(proc.pid)):
            assert time.monotonic() < deadline, "the pull never reached the stall"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # failed: no pull outlives the test
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130
    assert out == ""
    assert err == (
        "tokenkeys pull: interrupted at tokenizer.json (131072 of 1760640 bytes); "
        "nothing was installed\n"
    )
    assert leftovers(cache) == []


def test_interrupt_dropped_by_a_callback_during_startup_still_counts(
    grpc_server,  # noqa: ANN001
    tmp_path: Path,
) -> None:
    # The server stalls before its first chunk, so a pull that lost the Ctrl-C would wait there
    # (the safety net below), and one that ignored it would install the tokenizer.
    tokenizer = Tokenizer.load(default_tokenizer_path())
    registry, streamer = served(tokenizer, lambda messages, call: [Stall(60), *messages])
    target = grpc_server(registry).target
    cache = tmp_path / "cache"
    proc = _pull(target, cache, prelude=_SIGINT_IN_A_CALLBACK_DURING_IMPORTS)
    out, err = proc.communicate(timeout=60)  # a safety net, not a criterion
    assert (proc.returncode, out, err) == (130, "", "")
    assert streamer.calls == 0, "the pull started its transfer after the Ctrl-C"
    assert leftovers(cache) == []
