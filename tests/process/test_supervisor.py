"""``serve --processes N`` and ``route --processes N``: N processes behind one port, supervised.

Real processes, real sockets: which worker answers is read from /metrics (``tokenkeys_process``
names the pid), over a new connection each time so that the kernel's SO_REUSEPORT hash spreads
them. No timings: every wait is for a condition, bounded only so a broken build fails.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import grpc
import httpx
import pytest
from served import Served
from worker_pids import announced_pids, answering_pids, gone, until

from tokenkeys._gen.openengine.v1 import tokenizer_pb2, tokenizer_pb2_grpc

from support import REPO


@pytest.fixture(scope="module")
def engine():
    with Served() as served:
        yield served


def test_serve_workers_answer_on_one_port_from_each_process(engine) -> None:
    with Served("--processes", "2", "--engine", engine.grpc_target) as front:
        pids = announced_pids(front.lines)
        assert len(pids) == 2 and os.getpid() not in pids
        url = f"http://{front.http_address}"
        assert answering_pids(url, pids) == pids
        # Both faces on the one port of each: gRPC Tokenize over fresh channels, and a
        # completion forwarded to the one engine, counted as /tokenize counts it.
        for _ in range(4):
            with grpc.insecure_channel(front.grpc_target) as channel:
                stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
                answer = stub.Tokenize(tokenizer_pb2.TokenizeRequest(texts=["Hello world"]))
                assert answer.results[0].count > 0
        with httpx.Client(base_url=url, timeout=30) as client:
            counted = client.post("/tokenize", json={"prompt": "Hello world"}).json()["count"]
            done = client.post("/v1/completions", json={"prompt": "Hello world", "max_tokens": 2})
            assert done.status_code == 200, done.text
            assert done.json()["usage"]["prompt_tokens"] == counted
        # The served identity is one: every worker shows the same fingerprint line.
        assert sum(line.startswith("serving ") for line in front.lines) == 1
        front.signal(signal.SIGTERM)
        assert front.wait() == 0
    for pid in pids:
        assert any(
            line.startswith("worker ") and f"(pid {pid}) stopped" in line for line in front.lines
        ), front.lines
        until(lambda pid=pid: gone(pid), f"worker {pid} exited")


def test_a_killed_worker_is_restarted(engine) -> None:
    with Served("--processes", "2", "--engine", engine.grpc_target) as front:
        pids = announced_pids(front.lines)
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        until(lambda: any("restarted (pid" in line for line in front.lines), "a restart")
        (line,) = [line for line in front.lines if "restarted (pid" in line]
        new = int(re.search(r"pid (\d+)", line).group(1))
        assert new not in pids
        survivors = (pids - {victim}) | {new}
        assert answering_pids(f"http://{front.http_address}", survivors) == survivors
        assert any(f"(pid {victim}) exited with status -9" in line for line in front.lines)
        front.signal(signal.SIGTERM)
        assert front.wait() == 0


def test_workers_leave_when_their_supervisor_is_killed(engine) -> None:
    with Served("--processes", "2", "--engine", engine.grpc_target) as front:
        pids = announced_pids(front.lines)
        front.proc.kill()
        for pid in pids:
            until(lambda pid=pid: gone(pid), f"worker {pid} left after its supervisor")


def _refused(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenkeys.cli", "serve", "--grpc-port", "0", "--http-port", "0"]
        + list(args),
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_workers_refused_with_the_simulated_engine() -> None:
    done = _refused("--processes", "2")
    assert done.returncode == 2
    assert "--processes 2 needs --engine HOST:PORT" in done.stderr
    assert "prefix cache and KV events" in done.stderr


def test_workers_count_and_taken_port_refused(engine) -> None:
    done = _refused("--processes", "0", "--engine", engine.grpc_target)
    assert done.returncode == 2 and "--processes must be 1..256, got 0" in done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = _refused("--processes", "2", "--engine", engine.grpc_target, "--http-port", port)
    assert done.returncode == 2
    assert f"cannot bind --http-port {port}" in done.stderr


def test_encode_threads_out_of_range_refused() -> None:
    done = _refused("--encode-threads", "0")
    assert done.returncode == 2 and "--encode-threads must be 1..256, got 0" in done.stderr
