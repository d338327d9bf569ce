"""A real ``tokenkeys serve`` process killed in the middle of a transfer leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from faulty_streams import leftovers
from ports import free_port

from tokenkeys.artifacts import Progress, PullSettings, fetch
from tokenkeys.errors import Unavailable

from support import REPO


def start_serve(port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkeys.cli", "serve", "--grpc-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "gRPC listening on " in line:
            return proc
    proc.kill()
    raise AssertionError("tokenkeys serve did not start")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_server_killed_mid_stream(tmp_path: Path) -> None:
    port = free_port()
    proc = start_serve(port)
    cache = tmp_path / "cache"
    seen: list[Progress] = []

    def kill_on_first_chunk(progress: Progress) -> None:
        if not seen:
            assert len(leftovers(cache)) == 2, "the partial folder holds tokenizer.json"
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        seen.append(progress)

    # A small window keeps the server from pushing the whole file before it dies.
    settings = PullSettings(chunk_size=16384, receive_window=65536, resume_backoff=0.01)
    try:
        with pytest.raises(Unavailable) as info:
            fetch(f"127.0.0.1:{port}", cache=cache, settings=settings, progress=kill_on_first_chunk)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    error = info.value
    assert proc.returncode == -signal.SIGKILL
    assert error.field == "tokenizer.json" and error.details["fault"] == "unavailable"
    done = seen[-1].done
    assert done < 1_759_751
    assert f"transfer stopped at tokenizer.json at byte {done} of 1759751" in error.message
    assert "after 2 resume attempts" in error.message
    assert leftovers(cache) == []
