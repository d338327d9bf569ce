"""A sidecar started before its vLLM (issues 38 and 32): it answers while it waits, then serves,
with the block size, hash algorithm, served model name and KV-event publisher vLLM reports (no
--block-size, no --cache-key-profile, a --model folder without a name, no --engine-kv-*).

The vLLM is the harness's default server (shared with the other modules of its configuration);
"before its vLLM" is its address not answering yet: the sidecar is pointed at a real TCP relay
to that vLLM whose port opens only once the waiting was seen (:class:`late_door.LateDoor`), as
a vLLM still loading its model refuses connections. vLLM's KV-event endpoints are reached directly.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from late_door import LateDoor

from tokenkeys._gen.openengine.v1 import cache_keys_pb2, tokenizer_pb2_grpc

from served_pair import EMBEDDED, TokenkeysServe
from vllm_server import BLOCK_SIZE, DEFAULT_CONFIG, MODEL_NAME, VllmServer

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(DEFAULT_CONFIG)]

#: Seconds for the polls below: a safety net for a broken engine, never a pass/fail criterion.
WAIT_LIMIT = 120.0


@pytest.fixture
def door(vllm: VllmServer) -> Iterator[LateDoor]:
    door = LateDoor("127.0.0.1", vllm.port)
    try:
        yield door
    finally:
        door.close()


def test_a_sidecar_started_first_waits_answering_then_serves_adopting_vllms_keys(vllm, door):
    late = f"http://127.0.0.1:{door.port}"
    process = TokenkeysServe(
        "--model", str(EMBEDDED),  # served under the folder's name until vLLM's is known
        "--backend", "transformers5",
        "--engine", f"vllm+{late}",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_LIMIT
        while True:  # not ready from the first answer on, then naming what vLLM answered
            with contextlib.suppress(httpx.TransportError):
                health = httpx.get(f"{process.url}/health", timeout=5)
                assert health.status_code == 503, health.text
                if f"waiting for vLLM at {late}" in health.json()["reason"]:
                    break
            assert time.monotonic() < deadline and process.process.poll() is None
            time.sleep(0.05)
        assert httpx.get(f"{process.url}/livez", timeout=5).status_code == 200
        refused = httpx.post(
            f"{process.url}/v1/completions",
            json={"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 1},
            timeout=5,
        )
        assert refused.status_code == 503 and late in refused.json()["error"]["message"]

        door.open()  # vLLM "comes up"
        process.wait_healthy(WAIT_LIMIT)
        # vLLM's served name (its /v1/models), in place of the folder's.
        served = [m["id"] for m in httpx.get(f"{process.url}/v1/models").json()["data"]]
        assert served[0] == MODEL_NAME and EMBEDDED.name not in served, served
        log = process.log_text()
        assert f"under the engine's names: {MODEL_NAME}" in log
        # vLLM's publisher (tcp://*:PORT in its --kv-events-config) on the host of its address.
        assert (
            f"KV events from vLLM's publisher at {vllm.events_endpoint} (replay "
            f"{vllm.replay_endpoint}, topic '{vllm.topic}')"
        ) in log
        answer = httpx.post(
            f"{process.url}/v1/completions",
            json={"model": MODEL_NAME, "prompt": "Hello there", "max_tokens": 2},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["prompt_tokens"] > 0
        with grpc.insecure_channel(process.target) as channel:
            spec = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel).GetCacheKeySpec(
                cache_keys_pb2.GetCacheKeySpecRequest(model=MODEL_NAME), timeout=30
            )
        # vLLM's block size (the harness's, not tokenkeys' default 16) and its hash algorithm
        # at the profile of its release.
        assert spec.hash_unit == BLOCK_SIZE != 16
        assert spec.profile_id == "vllm/sha256_cbor@0.31"
        assert "cache keys as vLLM reports them: vllm/sha256_cbor@0.31" in process.log_text()
    finally:
        process.stop()
