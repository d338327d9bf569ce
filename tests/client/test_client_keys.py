"""CacheKeyClient and strategy_from_server against real loopback servers."""

from __future__ import annotations

import json

import pytest

from tokenkeys._gen.openengine.v1 import cache_keys_pb2 as kpb
from tokenkeys.client import CacheKeyClient, strategy_from_server
from tokenkeys.errors import (
    FailedPrecondition,
    InvalidArgument,
    LimitExceeded,
    Unavailable,
    Unsupported,
)
from tokenkeys.keys import Adapter, KeyContext, block_keys, make_spec
from tokenkeys.keys.proto import (
    keys_from_message,
    request_to_message,
    spec_from_message,
    spec_to_message,
)
from tokenkeys.keys.service import CacheKeyService
from tokenkeys.keys.strategy import KeyRequest, KeyStrategy
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import attach_cache_keys
from tokenkeys.tokenizer import TokenizerOptions

TOKENS = list(range(1000, 1100))


def _serve(grpc_server, spec, limits: Limits | None = None):
    limits = limits or Limits()
    models = load_models([ModelSource.default()], TokenizerOptions(), limits)
    attach_cache_keys(models, spec, limits)
    return grpc_server(models, limits)


def test_cbor_spec_is_computed_locally_after_its_vectors_pass(grpc_server) -> None:
    spec = make_spec("vllm/sha256_cbor@0.31", 16)
    server = _serve(grpc_server, spec)
    with CacheKeyClient(server.target) as client:
        strategy = strategy_from_server(client, expected_fingerprint=spec.fingerprint)
        assert strategy.decision.mode == "local"
        assert f"all {len(spec.vectors)} vectors" in strategy.decision.reason
        ctx = KeyContext(adapter=Adapter("a", "/a"), cache_salt="s")
        local = strategy.compute(TOKENS, ctx)
        assert local == client.compute(strategy.spec, [KeyRequest(TOKENS, ctx)])[0]
        assert local == block_keys(TOKENS, spec, ctx)


def test_pickle_spec_goes_remote_in_batches(grpc_server) -> None:
    spec = make_spec("vllm/sha256@0.31", 16)
    # The server takes at most 2 requests per call; the client splits 5 into 3 calls.
    server = _serve(grpc_server, spec, Limits(max_texts_per_request=2))
    with CacheKeyClient(server.target, max_requests_per_call=2) as client:
        strategy = strategy_from_server(client)
        assert strategy.decision.mode == "remote"
        assert "not client-computable" in strategy.decision.reason
        requests = [KeyRequest(TOKENS[: 16 * i + 3]) for i in range(5)]
        assert strategy.compute_many(requests) == [block_keys(r.tokens, spec) for r in requests]
        assert strategy.compute_many([]) == []
    with CacheKeyClient(server.target, max_requests_per_call=3) as client:
        with pytest.raises(LimitExceeded, match="at most 2"):
            client.compute(spec, [KeyRequest(TOKENS)] * 3)
    with CacheKeyClient(server.target, max_tokens_per_call=150) as client:
        # Token budget: 100 + 100 > 150, so two calls of one request each.
        assert client.compute(spec, [KeyRequest(TOKENS)] * 2) == [block_keys(TOKENS, spec)] * 2


def test_sglang_signed_event_keys_round_trip(grpc_server) -> None:
    spec = make_spec("sglang/sha256@0.5.23", 4)
    server = _serve(grpc_server, spec)
    with CacheKeyClient(server.target) as client:
        got = client.compute(client.spec(), [KeyRequest(TOKENS, KeyContext(cache_salt="t"))])[0]
    assert got == block_keys(TOKENS, spec, KeyContext(cache_salt="t"))
    assert any(k.event_key < 0 for k in got)


def test_strict_mode_and_stale_specs(grpc_server) -> None:
    spec = make_spec("vllm/xxhash@0.31", 16, root_seed="1")
    server = _serve(grpc_server, spec)
    with CacheKeyClient(server.target) as client:
        with pytest.raises(Unsupported, match="strict key strategy refuses"):
            strategy_from_server(client, strict=True)
        with pytest.raises(FailedPrecondition, match="was advertised") as info:
            strategy_from_server(client, expected_fingerprint="0" * 64)
        assert info.value.details["spec_fingerprint"] == spec.fingerprint
        # Keys are never computed under a spec the server no longer serves.
        other = make_spec("vllm/xxhash@0.31", 16, root_seed="2")
        with pytest.raises(FailedPrecondition, match="expected_spec_fingerprint") as info:
            client.compute(other, [KeyRequest(TOKENS)])
        # The current fingerprint travels in the error, so a router can refetch the spec.
        assert info.value.details["spec_fingerprint"] == spec.fingerprint
        assert info.value.field == "expected_spec_fingerprint"


def test_spec_without_vectors_goes_remote(grpc_server) -> None:
    spec = make_spec("dynamo/xxh3@1.6", 16)
    server = _serve(grpc_server, spec)
    with CacheKeyClient(server.target) as client:
        lean = client.spec(include_vectors=False)
        assert lean.fingerprint == spec.fingerprint and lean.vectors == ()
        strategy = KeyStrategy(lean, client)
        assert strategy.decision.mode == "remote" and "no test vectors" in strategy.decision.reason
        assert strategy.compute(TOKENS) == block_keys(TOKENS, spec)


def test_inconsistent_or_tampered_specs_are_not_trusted() -> None:
    spec = make_spec("vllm/sha256_cbor@0.31", 16)
    message = spec_to_message(spec)
    assert spec_from_message(message).to_dict() == spec.to_dict()
    forged = spec_to_message(spec)
    forged.hash_unit = 32
    with pytest.raises(FailedPrecondition, match="hash_unit=32"):
        spec_from_message(forged)
    forged = spec_to_message(spec)
    forged.spec_json = "[1, 2]"
    with pytest.raises(FailedPrecondition, match="cannot be read"):
        spec_from_message(forged)
    # A vector changed after sealing: the spec still reads, but the strategy will not trust it.
    data = json.loads(message.spec_json)
    data["vectors"][2]["event_keys"][0] += 1
    tampered = spec_to_message(spec)
    tampered.spec_json = json.dumps(data)
    decision = KeyStrategy(spec_from_message(tampered)).decision
    assert decision.mode == "refused" and "vectors_digest" in decision.reason


def test_client_errors() -> None:
    with pytest.raises(InvalidArgument):
        CacheKeyClient("127.0.0.1:1", max_requests_per_call=0)
    with CacheKeyClient("127.0.0.1:1", timeout=2) as client, pytest.raises(Unavailable):
        client.spec()
    spec = make_spec("vllm/sha256_cbor@0.31", 16)
    with CacheKeyClient("127.0.0.1:1", timeout=2) as client, pytest.raises(InvalidArgument):
        client.compute(spec, [KeyRequest([-1])])


def test_local_service_matches_the_strategy_contract() -> None:
    # The service answers the same keys in process (the CLI's path) as the core.
    spec = make_spec("llmd/cbor-fnv64@0.10", 16)
    service = CacheKeyService(spec, Limits())
    ctx = KeyContext(model="m")
    response = service.compute_now(
        kpb.ComputeCacheKeysRequest(requests=[request_to_message(TOKENS, ctx)])
    )
    assert keys_from_message(response.results[0], signed=False) == block_keys(TOKENS, spec, ctx)


async def test_the_async_client_is_the_core_of_the_blocking_one(grpc_server) -> None:
    """Both faces make the same calls; the blocking one serves several threads at once."""
    import asyncio
    import concurrent.futures

    from tokenkeys.client import AsyncCacheKeyClient

    spec = make_spec("vllm/sha256@0.31", 16)
    server = _serve(grpc_server, spec)
    async with AsyncCacheKeyClient(server.target) as remote:
        assert (await remote.spec()).fingerprint == spec.fingerprint
        assert await remote.compute(spec, [KeyRequest(TOKENS)]) == [block_keys(TOKENS, spec)]
    requests = [[KeyRequest(TOKENS[: 16 * i + 5])] for i in range(1, 7)]
    with CacheKeyClient(server.target) as client, concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = await asyncio.gather(
            *(asyncio.wrap_future(pool.submit(client.compute, spec, r)) for r in requests)
        )
    assert answers == [[block_keys(r[0].tokens, spec)] for r in requests]
