"""Acceptance: ``tokenkeys serve --engine vllm+http://...`` in front of a real vLLM (issue 12).

One vLLM 0.32 server (the harness's default configuration, shared with the parity modules) and
one sidecar process in front of it: generation forwarded as token ids returns vLLM's own text
and usage, ``/tokenize`` equals vLLM's, vLLM's KV events are relayed on the sidecar's ZMQ
publisher and gRPC stream, and every key the sidecar checks matches the engine's. A second
sidecar started with a wrong ``--root-seed`` counts and logs the mismatch, advertises its keys
as unverified, and a router in front of it routes it by load. Wrong ``--block-size`` or
algorithm: the sidecar refuses to start, naming both values.
"""

from __future__ import annotations

import grpc
import httpx
import pytest

from tokenkeys._gen.openengine.v1 import kv_pb2, model_pb2, openengine_pb2_grpc, server_pb2
from tokenkeys.keys import block_keys, make_spec

from served_pair import TokenkeysServe, keys_checked, random_prompt, sidecar_args, wait_for
from vllm_events import EventCollector
from vllm_server import BLOCK_SIZE, DEFAULT_CONFIG, MODEL_NAME

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(DEFAULT_CONFIG)]

SPEC = make_spec("vllm/sha256_cbor@0.31", BLOCK_SIZE)  # vLLM's default root (no PYTHONHASHSEED)


def sse(response: httpx.Response) -> list[dict]:
    """The JSON chunks of a streamed answer (without ``[DONE]``)."""
    import json

    out = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def text_and_usage(response: httpx.Response, stream: bool, chat: bool) -> tuple[str, dict]:
    assert response.status_code == 200, response.text
    if not stream:
        body = response.json()
        choice = body["choices"][0]
        return (choice["message"]["content"] if chat else choice["text"]), body["usage"]
    chunks = sse(response)
    pieces = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            pieces.append((choice["delta"].get("content") if chat else choice["text"]) or "")
    usage = [c["usage"] for c in chunks if c.get("usage")]
    return "".join(pieces), usage[-1]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_generation_returns_vllms_text_and_usage(vllm, sidecar, chat, stream) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    words = "Sidecars forward every request to the engine behind them. " * 5
    body: dict = {"model": MODEL_NAME, "max_tokens": 6, "seed": 11, "stream": stream}
    body |= {"messages": [{"role": "user", "content": words}]} if chat else {"prompt": words}
    if stream:
        body["stream_options"] = {"include_usage": True}
    ours = text_and_usage(httpx.post(sidecar.url + path, json=body, timeout=300), stream, chat)
    theirs = text_and_usage(httpx.post(vllm.url + path, json=body, timeout=300), stream, chat)
    assert ours[0] == theirs[0]
    for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert ours[1][field] == theirs[1][field], field


def test_tokenize_equals_vllms(vllm, sidecar) -> None:
    texts = [
        "Hello, world!",
        "Numbers 1234567 and \u2166 \u0661\u0662 after spaces",
        "<|im_start|>user\ncaf\u00e9 na\u00efve<|im_end|>",
        "  leading spaces\tand\ttabs\n\n",
    ]
    for text in texts:
        for special in (True, False):
            body = {"model": MODEL_NAME, "prompt": text, "add_special_tokens": special}
            ours = httpx.post(f"{sidecar.url}/tokenize", json=body, timeout=60)
            theirs = httpx.post(f"{vllm.url}/tokenize", json=body, timeout=60)
            assert ours.status_code == theirs.status_code == 200
            assert ours.json()["tokens"] == theirs.json()["tokens"], text
            assert ours.json()["count"] == theirs.json()["count"]


def test_a_repeated_prompt_shows_vllms_cached_tokens(sidecar) -> None:
    prompt = random_prompt(21, 5 * BLOCK_SIZE + 7)
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2}
    first = httpx.post(f"{sidecar.url}/v1/completions", json=body, timeout=300).json()
    second = httpx.post(f"{sidecar.url}/v1/completions", json=body, timeout=300).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # vLLM reuses every full block of the prompt: 5 blocks of 32 tokens.
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 5 * BLOCK_SIZE


def test_every_checked_key_matches_and_events_are_relayed(sidecar) -> None:
    channel = grpc.insecure_channel(sidecar.target)
    control = openengine_pb2_grpc.ControlStub(channel)
    sources = control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(), timeout=30).sources
    zmq_source = next(s for s in sources if s.transport == "zmq")
    endpoint = f"tcp://{zmq_source.endpoint_addr.host}:{zmq_source.endpoint_addr.port}"
    relayed = EventCollector(endpoint, zmq_source.replay_endpoint, zmq_source.topic, "0.32")
    try:
        before = keys_checked(sidecar.url)
        prompt = random_prompt(31, 7 * BLOCK_SIZE + 3)
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}
        assert httpx.post(f"{sidecar.url}/v1/completions", json=body, timeout=300).is_success
        counts = wait_for(
            lambda: (c := keys_checked(sidecar.url))["match"] >= before["match"] + 7 and c,
            "7 more matching keys",
        )
        assert counts["mismatch"] == 0
        want = [k.event_key for k in block_keys(prompt, SPEC)]
        relayed.wait_until(
            lambda: any(
                e.token_ids[:BLOCK_SIZE] == tuple(prompt[:BLOCK_SIZE]) for e in relayed.stored()
            ),
            "the prompt's blocks on the sidecar's publisher",
        )
        stored = [e for e in relayed.stored() if e.token_ids[:BLOCK_SIZE] == tuple(prompt[:32])]
        assert list(stored[0].block_hashes[:7]) == want
        # The gRPC stream carries the same batches, each tagged with the spec.
        stream = control.SubscribeKvEvents(
            kv_pb2.SubscribeKvEventsRequest(start_sequence_number=0), timeout=60
        )
        for message in stream:
            assert message.batch.key_spec.spec_fingerprint == SPEC.fingerprint
            hashes = [
                int.from_bytes(h.value, "big")
                for e in message.batch.events
                for h in e.block_stored.block_hashes
            ]
            if want[0] in hashes:
                break
        stream.cancel()
        info = control.GetModelInfo(model_pb2.GetModelInfoRequest(model=MODEL_NAME), timeout=30)
        assert info.tokenizer.keys_unverified is False
        assert info.tokenizer.key_spec.spec_fingerprint == SPEC.fingerprint
    finally:
        relayed.close()
        channel.close()


def test_the_event_layout_is_the_one_of_the_release_vllm_reports(vllm, sidecar) -> None:
    assert httpx.get(f"{vllm.url}/version", timeout=30).json()["version"] == "0.32.0"
    with grpc.insecure_channel(sidecar.target) as channel:
        control = openengine_pb2_grpc.ControlStub(channel)
        info = control.GetServerInfo(server_pb2.GetServerInfoRequest(), timeout=30)
    assert info.extra["kv_events_vllm_version"] == "0.32"
    assert "KV events in vLLM 0.32's layout, the release vLLM at" in sidecar.log_text()


def test_load_is_vllms(sidecar) -> None:
    with grpc.insecure_channel(sidecar.target) as channel:
        control = openengine_pb2_grpc.ControlStub(channel)
        load = control.GetLoad(server_pb2.GetLoadRequest(), timeout=30)
        info = control.GetServerInfo(server_pb2.GetServerInfoRequest(), timeout=30)
    # vLLM's num_gpu_blocks with a 1 GiB KV cache (VLLM_CPU_KVCACHE_SPACE=1) of the tiny model.
    assert load.total_kv_blocks == info.capacity.total_kv_blocks > 0
    assert info.capacity.kv_block_size == BLOCK_SIZE
    assert load.running_requests == 0 and load.queued_requests == 0


@pytest.mark.parametrize(
    ("option", "value", "theirs"),
    [
        ("--block-size", "64", "vLLM's block_size is 32"),
        (
            "--cache-key-profile",
            "vllm/sha256@0.31",
            "vLLM's prefix_caching_hash_algo is sha256_cbor",
        ),
        ("--max-model-len", "2048", "vLLM's max_model_len is 4096"),
        ("--served-model-name", "other", f"serves ['{MODEL_NAME}']"),
    ],
)
def test_a_conflict_with_vllm_refuses_to_start(vllm, option, value, theirs) -> None:
    process = TokenkeysServe(*sidecar_args(vllm, option, value))
    try:
        assert process.wait_exit() != 0
        log = process.log_text()
        assert option in log and value in log and theirs in log, log[-2000:]
    finally:
        process.stop()
