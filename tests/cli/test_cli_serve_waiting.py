"""A sidecar answers while it waits for its vLLM (issue 38): a real ``serve`` process whose vLLM
address has nobody listening yet.

It listens from the start: ``/health`` answers 503 with the reason (what the vLLM address
answered), ``/livez`` that the process is alive, a model route 503 with the reason, gRPC
``Health`` STARTING with the reason. That it then serves once vLLM comes up is proven against a
real vLLM in ``tests/realengine/test_vllm_sidecar_start.py``.
"""

from __future__ import annotations

import re
import signal
import time

import grpc
import httpx
from ports import free_port
from test_cli_logs import serve, wait_line

from tokenkeys._gen.openengine.v1 import lifecycle_pb2, openengine_pb2_grpc

#: Seconds the polls below may take at most: a safety net, never a pass/fail criterion on time.
DEADLINE = 60.0


def poll(get):  # noqa: ANN001, ANN201 - a request and its answer
    """The first answer ``get()`` gives (connection refusals retried until the deadline)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return get()
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_sidecar_waiting_for_vllm_answers_not_ready_with_the_reason(tmp_path) -> None:
    vllm = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    proc, out, _ = serve(
        tmp_path,
        "--engine", f"vllm+{vllm}",
        "--engine-kv-events", f"tcp://127.0.0.1:{free_port()}",
        "--no-kv-events",
    )  # fmt: skip
    try:
        line = wait_line(proc, out, "answering health checks while the engines start")
        target, address = re.search(r"gRPC on (\S+), HTTP on (\S+)", line).groups()
        base = f"http://{address}"
        # Not ready from the first answer on; the reason soon names vLLM (the first answers may
        # come before the sidecar asked it: "starting the engines").
        deadline = time.monotonic() + DEADLINE
        while True:
            health = poll(lambda: httpx.get(f"{base}/health", timeout=5))
            assert health.status_code == 503
            body = health.json()
            assert body["status"] == "starting" and body["reason"], body
            if f"waiting for vLLM at {vllm}" in body["reason"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert f"waiting for vLLM at {vllm}" in body["reason"], body
        alive = httpx.get(f"{base}/livez", timeout=5)
        assert alive.status_code == 200 and alive.json() == {"status": "alive", "state": "starting"}
        refused = httpx.post(
            f"{base}/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=5
        )
        assert refused.status_code == 503
        assert f"waiting for vLLM at {vllm}" in refused.json()["error"]["message"]
        with grpc.insecure_channel(target) as channel:
            control = openengine_pb2_grpc.ControlStub(channel)
            answer = control.Health(lifecycle_pb2.HealthRequest(), timeout=10)
        scheduler = next(c for c in answer.checks if c.name == "scheduler")
        assert scheduler.state == lifecycle_pb2.HEALTH_STATE_STARTING
        assert f"waiting for vLLM at {vllm}" in scheduler.message
        assert "HTTP listening on " not in out.read_text()  # it does not serve yet
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
