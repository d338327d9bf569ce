"""Graceful shutdown of ``tokenkeys serve``: SIGTERM drains.

A slow streamed generation (``--simulate-latency``) in flight over HTTP and another over gRPC
both complete after SIGTERM; meanwhile new calls are refused (HTTP 503, gRPC UNAVAILABLE),
/health answers 503 with the state and Control.Health DRAINING; the process exits 0.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import grpc
import httpx
from served import Served

from tokenkeys._gen.openengine.v1 import (
    generation_pb2,
    lifecycle_pb2,
    openengine_pb2_grpc,
    tokenizer_pb2_grpc,
)
from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as tok_pb

TOKENS = 30  # at 40 ms each: a stream of about 1.2 s


def _http_stream(url: str, out: dict) -> None:
    body = {"prompt": "hello", "max_tokens": TOKENS, "stream": True, "ignore_eos": True}
    chunks = []
    with httpx.Client(base_url=url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            out["status"] = response.status_code
            for line in response.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line.removeprefix("data: "))
                    out["started"].set()
    out["chunks"] = chunks


def _grpc_stream(target: str, out: dict) -> None:
    request = generation_pb2.GenerateRequest(
        prompt="hello",
        stopping=generation_pb2.StoppingOptions(max_tokens=TOKENS, ignore_eos=True),
    )
    messages = []
    with grpc.insecure_channel(target) as channel:
        try:
            for message in openengine_pb2_grpc.InferenceStub(channel).Generate(request):
                messages.append(message)
                out["started"].set()
        except grpc.RpcError as error:
            out["error"] = error.code()
    out["messages"] = messages


def test_sigterm_finishes_in_flight_streams_refuses_new_calls_and_exits_0() -> None:
    args = ["--simulate-latency", "--decode-us-per-token", "40000", "--shutdown-timeout", "20"]
    with Served(*args) as served:
        url = f"http://{served.http_address}"
        http_out: dict = {"started": threading.Event()}
        grpc_out: dict = {"started": threading.Event()}
        threads = [
            threading.Thread(target=_http_stream, args=(url, http_out)),
            threading.Thread(target=_grpc_stream, args=(served.grpc_target, grpc_out)),
        ]
        for thread in threads:
            thread.start()
        assert http_out["started"].wait(20) and grpc_out["started"].wait(20)

        served.signal(signal.SIGTERM)
        with grpc.insecure_channel(served.grpc_target) as channel:
            control = openengine_pb2_grpc.ControlStub(channel)
            deadline = time.monotonic() + 10
            while True:  # the signal is handled asynchronously
                health = control.Health(lifecycle_pb2.HealthRequest())
                if health.state == lifecycle_pb2.HEALTH_STATE_DRAINING:
                    break
                assert time.monotonic() < deadline, "never reported draining"
                time.sleep(0.01)
            try:
                tokenizer = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
                tokenizer.Tokenize(tok_pb.TokenizeRequest(texts=["new"]))
                raise AssertionError("a new call was admitted while draining")
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                assert "shutting down" in error.details()
        with httpx.Client(base_url=url, timeout=10) as client:
            health = client.get("/health")
            assert health.status_code == 503
            assert health.json()["status"] == "draining"
            assert health.json()["in_flight"] >= 1
            refused = client.post("/tokenize", json={"prompt": "new"})
            assert refused.status_code == 503
            assert refused.json()["error"]["type"] == "ServiceUnavailableError"

        for thread in threads:
            thread.join(30)
        assert served.wait(30) == 0

    # Nothing in flight was cut: every token arrived and both streams ended normally.
    assert http_out["status"] == 200
    assert http_out["chunks"][-1] == "[DONE]"
    finals = [json.loads(c) for c in http_out["chunks"][:-1]]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["text"] for c in finals)
    assert text
    messages = grpc_out["messages"]
    assert messages[-1].WhichOneof("event") == "finished"
    assert sum(len(m.token.tokens) for m in messages if m.HasField("token")) == TOKENS
    assert any("draining" in line for line in served.lines)
    assert served.lines[-1] == "stopped"


def test_the_drain_deadline_bounds_the_wait() -> None:
    args = ["--simulate-latency", "--decode-us-per-token", "200000", "--shutdown-timeout", "0.3"]
    with Served(*args) as served:
        out: dict = {"started": threading.Event()}
        thread = threading.Thread(target=_grpc_stream, args=(served.grpc_target, out))
        thread.start()
        assert out["started"].wait(20)
        started = time.monotonic()
        served.signal(signal.SIGTERM)
        assert served.wait(30) == 0
        assert time.monotonic() - started < 10  # a 6 s stream was not waited for
        thread.join(10)
    assert any("still in flight" in line for line in served.lines)
    assert out["error"] == grpc.StatusCode.UNAVAILABLE  # cut at the deadline, told so


def test_a_clean_drain_logs_no_error() -> None:
    # uvicorn logged "ERROR: Cancel 0 running task(s), timeout graceful shutdown exceeded"
    # whenever a keep-alive connection was open at a clean stop (its wait had a 0 s timeout).
    with Served() as served, httpx.Client(base_url=f"http://{served.http_address}") as client:
        assert client.post("/tokenize", json={"prompt": "hi"}).status_code == 200
        served.signal(signal.SIGTERM)
        assert served.wait(30) == 0
    assert served.lines[-1] == "stopped"
    assert not [line for line in served.errors if "ERROR" in line], served.errors
