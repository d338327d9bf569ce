"""OpenEngineTokenizer over a real loopback server: semantics, bad input, limits, concurrency."""

from __future__ import annotations

import concurrent.futures
import random

import grpc
import pytest

from tokenkeys._gen.openengine.v1 import cache_keys_pb2, tokenizer_pb2_grpc
from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.client import TokenizerClient
from tokenkeys.errors import FailedPrecondition, InvalidArgument, LimitExceeded, NotFound
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import DEFAULT_MODEL_NAME, TokenizerOptions


def registry(limits: Limits | None = None, **options: object):
    return load_models([ModelSource.default()], TokenizerOptions(**options), limits or Limits())


@pytest.fixture
def client(grpc_server):
    server = grpc_server(registry(Limits(max_texts_per_request=8, max_tokens_per_request=64)))
    with TokenizerClient(server.target) as c:
        yield c


@pytest.fixture
def stub(grpc_server):
    server = grpc_server(registry())
    channel = grpc.insecure_channel(server.target)
    yield tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
    channel.close()


def test_info_reports_identity_and_defaults(client: TokenizerClient) -> None:
    info = client.info()
    assert info.model == DEFAULT_MODEL_NAME
    assert list(info.served_names) == [DEFAULT_MODEL_NAME]
    assert info.vocab_size == 49152
    assert info.special_tokens.bos.id == 1
    assert [e.id for e in info.special_tokens.eos] == [2]
    assert info.defaults.add_special_tokens is True
    assert info.defaults.add_special_tokens_chat is False
    assert info.defaults.nul_handling == pb.NUL_HANDLING_KEEP
    assert info.max_context_length == 8192
    assert len(info.chat_template_sha256) == 64
    assert {a.path for a in info.artifacts} == {"tokenizer.json", "tokenizer_config.json"}
    assert pb.TOKENIZER_OPERATION_TOKENIZE in info.supported_operations
    assert info.identity.behaviour == "tokenizers/1"


def test_empty_text_is_valid(client: TokenizerClient) -> None:
    result = client.tokenize([""]).results[0]
    assert list(result.ids) == [] and result.count == 0
    assert client.tokenize([]).results == []


def test_token_strs_and_offsets(client: TokenizerClient) -> None:
    result = client.tokenize(["Hello world"], return_token_strs=True, return_offsets=True)
    r = result.results[0]
    assert list(r.token_strs) == ["Hello", " world"]
    assert [(o.start, o.end) for o in r.offsets] == [(0, 5), (5, 11)]
    assert result.total_tokens == 2


def test_unknown_model_lists_served_names(client: TokenizerClient) -> None:
    with pytest.raises(NotFound, match=DEFAULT_MODEL_NAME):
        client.tokenize(["x"], model="llama-70b")


def test_stale_fingerprint_carries_the_current_one(stub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Tokenize(pb.TokenizeRequest(texts=["x"], expected_fingerprint="0" * 64))
    err = info.value
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    current = dict(err.trailing_metadata())["tokenkeys-fingerprint"]
    assert current in err.details()
    ok = stub.Tokenize(pb.TokenizeRequest(texts=["x"], expected_fingerprint=current))
    assert ok.fingerprint == current


def test_detokenize_semantics(client: TokenizerClient) -> None:
    ids = list(client.tokenize(["Hi"], add_special_tokens=False).results[0].ids)
    out = client.detokenize([[], [1, *ids, 2]])
    assert list(out.texts) == ["", "<|im_start|>Hi<|im_end|>"]
    assert client.detokenize([[1, *ids, 2]], skip_special_tokens=True).texts[0] == "Hi"


def test_id_outside_vocabulary_names_id_and_position(client: TokenizerClient) -> None:
    with pytest.raises(InvalidArgument, match=r"sequences\[1\]\[2\] = 49152 is outside"):
        client.detokenize([[1], [1, 2, 49152]])


def test_limits_state_the_limit(client: TokenizerClient) -> None:
    with pytest.raises(LimitExceeded, match="at most 8"):
        client.tokenize(["a"] * 9)
    client.tokenize(["a"] * 8)
    with pytest.raises(LimitExceeded, match="at most 64 are allowed"):
        client.tokenize(["word " * 65])
    with pytest.raises(LimitExceeded, match="at most 64"):
        client.detokenize([[5] * 65])


def test_request_bytes_limit(grpc_server) -> None:
    server = grpc_server(registry(), Limits(max_request_bytes=1024))
    with TokenizerClient(server.target) as c, pytest.raises(LimitExceeded):
        c.tokenize(["x" * 2000])


def test_truncation(stub) -> None:
    text = "one two three four five six"
    full = stub.Tokenize(pb.TokenizeRequest(texts=[text])).results[0].ids
    right = stub.Tokenize(
        pb.TokenizeRequest(texts=[text], truncation=pb.Truncation(max_tokens=3))
    ).results[0]
    left = stub.Tokenize(
        pb.TokenizeRequest(
            texts=[text],
            truncation=pb.Truncation(max_tokens=3, side=pb.TRUNCATION_SIDE_LEFT),
        )
    ).results[0]
    assert list(right.ids) == list(full[:3]) and list(left.ids) == list(full[-3:])
    with pytest.raises(grpc.RpcError) as info:
        stub.Tokenize(pb.TokenizeRequest(texts=[text], truncation=pb.Truncation(max_tokens=0)))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "truncation.max_tokens" in info.value.details()


def test_unknown_enum_values_are_invalid_argument(stub) -> None:
    for request in (
        pb.TokenizeRequest(texts=["x"], nul_handling=42),
        pb.TokenizeRequest(texts=["x"], truncation=pb.Truncation(max_tokens=3, side=9)),
    ):
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_nul_handling_per_request(stub) -> None:
    text = "a\x00b"
    keep = stub.Tokenize(pb.TokenizeRequest(texts=[text], return_offsets=True)).results[0]
    strip = stub.Tokenize(
        pb.TokenizeRequest(texts=[text], nul_handling=pb.NUL_HANDLING_STRIP, return_offsets=True)
    ).results[0]
    assert list(strip.ids) == list(stub.Tokenize(pb.TokenizeRequest(texts=["ab"])).results[0].ids)
    assert list(keep.ids) != list(strip.ids)
    # Offsets refer to the text the caller sent, NULs included.
    assert strip.offsets[-1].end == 3


def test_cache_key_rpcs_unimplemented_without_a_spec(stub) -> None:
    for call, request in (
        (stub.GetCacheKeySpec, cache_keys_pb2.GetCacheKeySpecRequest()),
        (stub.ComputeCacheKeys, cache_keys_pb2.ComputeCacheKeysRequest()),
    ):
        with pytest.raises(grpc.RpcError) as info:
            call(request)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_many_concurrent_clients_get_exact_answers(grpc_server) -> None:
    server = grpc_server(registry())
    rng = random.Random(7)
    words = ["alpha", "beta", "γάμμα", "日本", "🎉", " ", "\n", "delta"]
    texts = ["".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(64)]
    local = registry().get(None).preprocessor
    want = [r.ids for r in local.tokenize_prompts(texts)]

    def work(seed: int) -> None:
        with TokenizerClient(server.target) as c:
            r = random.Random(seed)
            for _ in range(10):
                pick = r.sample(range(len(texts)), 5)
                got = c.tokenize([texts[i] for i in pick]).results
                assert [list(g.ids) for g in got] == [want[i] for i in pick]
                assert c.detokenize([want[i] for i in pick]).texts == [texts[i] for i in pick]
                with pytest.raises(InvalidArgument):
                    c.detokenize([[10**9]])

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        for f in [pool.submit(work, s) for s in range(32)]:
            f.result()


def test_fingerprint_mismatch_via_client(client: TokenizerClient) -> None:
    with pytest.raises(FailedPrecondition, match="fingerprint is now") as info:
        client.tokenize(["x"], expected_fingerprint="f" * 64)
    assert info.value.details["fingerprint"] == client.info().fingerprint
    assert info.value.field == "expected_fingerprint"
