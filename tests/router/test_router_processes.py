"""``route --processes N``: router replicas in N processes behind one HTTP port, drained."""

from __future__ import annotations

import signal

import httpx
from engine_stack import ServeProcess
from route_process import RouteProcess
from worker_pids import announced_pids, answering_pids, gone, until


def test_route_workers_share_the_port_and_drain(tmp_path) -> None:
    with ServeProcess() as worker:
        args = ["--worker", worker.target, "--processes", "2"]
        with RouteProcess(*args, cache=str(tmp_path / "cache")) as router:
            pids = announced_pids(router.lines)
            assert answering_pids(router.url, pids) == pids
            with httpx.Client(base_url=router.url, timeout=30) as client:
                done = client.post(
                    "/v1/completions", json={"prompt": "Hello world", "max_tokens": 2}
                )
                assert done.status_code == 200, done.text
            router.proc.send_signal(signal.SIGTERM)
            assert router.proc.wait(60) == 0
        for pid in pids:
            until(lambda pid=pid: gone(pid), f"router worker {pid} exited")
