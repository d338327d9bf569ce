"""Acceptance: the 50 block hashes of a real vLLM engine, reproduced over ComputeCacheKeys.

``tests/data/vectors/vllm-kv-events`` holds two BlockStored events of vLLM serving
Qwen/Qwen3-0.6B (``PYTHONHASHSEED=42``, block size 16, ``sha256_cbor``, bare-era extra keys),
without and with the LoRA adapter ``Alice``. Qwen3 shares Qwen2.5's vocabulary, so the served
tokenizer is ``tests/data/tokenizers/qwen2.5-instruct``. The chain is text -> Tokenize ->
ComputeCacheKeys on one real loopback server, then the same through ``tokenkeys serve`` started
with the serve options and ``tokenkeys keys --remote``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tokenkeys._gen.openengine.v1 import cache_keys_pb2 as kpb
from tokenkeys._gen.openengine.v1 import model_pb2, openengine_pb2_grpc, tokenizer_pb2_grpc
from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as tpb
from tokenkeys.client import CacheKeyClient, strategy_from_server
from tokenkeys.keys import Adapter, KeyContext
from tokenkeys.keys.deployment import KeySpecOptions, build_spec
from tokenkeys.keys.proto import request_to_message
from tokenkeys.keys.strategy import KeyRequest
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import attach_cache_keys
from tokenkeys.tokenizer import TokenizerOptions

from conformance_data import data_path
from support import REPO, run_cli

OPTIONS = KeySpecOptions(profile="vllm/sha256_cbor@0.29", block_size=16, root_seed="42")
SERVE_ARGS = ["--cache-key-profile", "vllm/sha256_cbor@0.29", "--block-size", "16"]
# The engine registered the adapter as Alice=charent/self_cognition_Alice; the bare era hashes
# only the name, the path travels along as the tagged era would need it.
ADAPTER = ("Alice", "charent/self_cognition_Alice")


def _events() -> list[dict]:
    folder = data_path("vectors", "vllm-kv-events")
    return [
        json.loads((folder / n).read_text()) for n in ("kv_event_base.json", "kv_event_lora.json")
    ]


def _context(event: dict) -> KeyContext | None:
    return KeyContext(adapter=Adapter(*ADAPTER)) if event["lora_name"] else None


def test_text_to_engine_hashes_over_grpc(grpc_server) -> None:
    events = _events()
    qwen = data_path("tokenizers", "qwen2.5-instruct")
    models = load_models([ModelSource("qwen3", qwen)], TokenizerOptions(), Limits())
    attach_cache_keys(models, build_spec(OPTIONS), Limits())
    server = grpc_server(models)
    channel = grpc.insecure_channel(server.target)
    stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
    tokenized = stub.Tokenize(tpb.TokenizeRequest(texts=[e["prompt"] for e in events]))
    requests = []
    for event, result in zip(events, tokenized.results, strict=True):
        # The engine stored the 25 full blocks (400 tokens); the 2-token tail has no key.
        assert list(result.ids[:400]) == event["token_ids"] and len(result.ids) == 402
        request = request_to_message(result.ids, _context(event))
        request.context.tokenizer_fingerprint = tokenized.fingerprint
        requests.append(request)
    response = stub.ComputeCacheKeys(kpb.ComputeCacheKeysRequest(requests=requests))
    got = [list(r.event_keys) for r in response.results]
    assert got == [e["block_hashes"] for e in events]
    assert sum(len(g) for g in got) == 50
    channel.close()


@pytest.fixture
def serve_process():
    """``tokenkeys serve`` with the engine's options, on a free loopback port."""
    qwen = data_path("tokenizers", "qwen2.5-instruct")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    process = subprocess.Popen(
        [sys.executable, "-m", "tokenkeys.cli", "serve", "--model", f"qwen3={qwen}"]
        + SERVE_ARGS
        + ["--root-seed", "42", "--grpc-port", "0", "--http-port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    target = None
    try:
        for line in process.stdout:
            if "gRPC listening on " in line:
                target = line.split()[-1]
                break
        if target is None:
            pytest.fail(f"tokenkeys serve did not start: {process.stderr.read()}")
        yield target
    finally:
        process.terminate()
        process.wait(10)


def test_engine_hashes_via_serve_options_and_cli_remote(serve_process, tmp_path: Path) -> None:
    events = _events()
    target = serve_process
    # Discovery advertises the served spec: the one the simulated engine keys its events with.
    channel = grpc.insecure_channel(target)
    info = openengine_pb2_grpc.ControlStub(channel).GetModelInfo(
        model_pb2.GetModelInfoRequest(model="qwen3")
    )
    channel.close()
    advertised = info.tokenizer.key_spec
    assert advertised.spec_fingerprint == build_spec(OPTIONS).fingerprint
    assert (
        advertised.profile_id == "vllm/sha256_cbor@0.29" and info.tokenizer.remote_key_computation
    )
    with CacheKeyClient(target, "qwen3") as client:
        strategy = strategy_from_server(client, expected_fingerprint=advertised.spec_fingerprint)
        assert strategy.decision.mode == "local"
        requests = [KeyRequest(e["token_ids"], _context(e)) for e in events]
        remote = client.compute(strategy.spec, requests)
        assert [[k.event_key for k in keys] for keys in remote] == [
            e["block_hashes"] for e in events
        ]
        assert strategy.compute_many(requests) == remote
    for event in events:
        tokens = tmp_path / "tokens.json"
        tokens.write_text(json.dumps(event["token_ids"]))
        args = ["keys", "--remote", target, "--name", "qwen3", "--tokens-file", str(tokens)]
        args += ["--profile", "vllm/sha256_cbor@0.29", "--block-size", "16", "--root-seed", "42"]
        if event["lora_name"]:
            args += ["--lora-name", ADAPTER[0], "--lora-path", ADAPTER[1]]
        out = json.loads(run_cli(*args, "--json").stdout)
        assert out["event_keys"] == event["block_hashes"]
        assert [int(k[-16:], 16) for k in out["keys"]] == event["block_hashes"]
    # Options that describe another deployment are refused by the server, not silently answered.
    stale = run_cli(
        "keys",
        "--remote",
        target,
        "--profile",
        "vllm/sha256_cbor@0.29",
        "--root-seed",
        "43",
        "--tokens",
        "1,2,3",
        "--json",
        check=False,
    )
    assert stale.returncode == 2 and "expected_spec_fingerprint" in stale.stderr
