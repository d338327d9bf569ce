"""GetCacheKeySpec and ComputeCacheKeys over a real loopback server: semantics and bad input."""

from __future__ import annotations

import concurrent.futures
import hashlib
import random

import grpc
import pytest

from tokenkeys._gen.openengine.v1 import cache_keys_pb2 as kpb
from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as tpb
from tokenkeys._gen.openengine.v1 import tokenizer_pb2_grpc
from tokenkeys.keys import Adapter, KeyContext, MMItem, block_keys, make_spec
from tokenkeys.keys.proto import (
    request_to_message,
    spec_from_message,
)
from tokenkeys.keys.registry import profile_ids
from tokenkeys.keys.service import CacheKeyService
from tokenkeys.keys.spec import BlockKey
from tokenkeys.keys.vectors import generate_vectors
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import ModelRegistry, ServedModel, attach_cache_keys
from tokenkeys.tokenizer import TokenizerOptions

from support import ServerThread

SPEC = make_spec("vllm/sha256_cbor@0.31", None, groups=[16, 32])
TOKENS = [(i * 7919) % 151_000 for i in range(100)]

INVALID = grpc.StatusCode.INVALID_ARGUMENT
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


def _spec_for(profile_id: str):
    seed = {"root_seed": "7"} if profile_id.startswith("vllm/xxhash") else {}
    return make_spec(profile_id, 16, **seed)


@pytest.fixture(scope="module")
def server():
    """One server: the default model under SPEC, and one model per profile named by its id."""
    base = load_models([ModelSource.default()], TokenizerOptions(), Limits())
    limits = Limits(max_texts_per_request=16, max_tokens_per_request=300_000)
    attach_cache_keys(base, SPEC, limits)
    default = base.get(None)
    registry = ModelRegistry()
    registry.add(default)
    for pid in profile_ids():
        registry.add(
            ServedModel(
                pid,
                default.tokenizer,
                default.preprocessor,
                cache_keys=CacheKeyService(_spec_for(pid), limits),
            )
        )
    registry.add(ServedModel("no-keys", default.tokenizer, default.preprocessor))
    with ServerThread(registry, limits) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.target)
    yield tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
    channel.close()


def _compute(
    stub, *requests: kpb.KeyRequest, model: str = "", **fields
) -> kpb.ComputeCacheKeysResponse:
    return stub.ComputeCacheKeys(
        kpb.ComputeCacheKeysRequest(model=model, requests=list(requests), **fields)
    )


def _keys(result: kpb.BlockKeys) -> list[BlockKey]:
    events = list(result.signed_event_keys or result.event_keys)
    return [BlockKey(d, e) for d, e in zip(result.keys, events, strict=True)]


def _error(stub, *requests: kpb.KeyRequest, model: str = "", **fields) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        _compute(stub, *requests, model=model, **fields)
    return info.value


def test_spec_is_served_and_verifies(stub, server) -> None:
    message = stub.GetCacheKeySpec(kpb.GetCacheKeySpecRequest())
    spec = spec_from_message(message)
    assert spec.to_dict() == SPEC.to_dict()
    assert message.profile_id == "vllm/sha256_cbor@0.31" and message.profile_version == "0.31"
    assert [(g.index, g.block_size, g.kind) for g in message.groups] == [
        (0, 16, "full_attention"),
        (1, 32, "full_attention"),
    ]
    assert message.root == SPEC.root and message.client_computable
    assert spec.sealed().fingerprint == message.fingerprint
    lean = stub.GetCacheKeySpec(kpb.GetCacheKeySpecRequest(include_vectors=False))
    assert lean.fingerprint == message.fingerprint and '"vectors"' not in lean.spec_json
    assert len(lean.spec_json) < len(message.spec_json)
    info = stub.GetTokenizerInfo(tpb.GetTokenizerInfoRequest())
    assert tpb.TOKENIZER_OPERATION_COMPUTE_CACHE_KEYS in info.supported_operations
    assert tpb.TOKENIZER_OPERATION_CACHE_KEY_SPEC in info.supported_operations


def test_several_requests_in_one_call_equal_the_core(stub) -> None:
    contexts = [
        None,
        KeyContext(cache_salt="tenant-a"),
        KeyContext(adapter=Adapter("alice", "/adapters/alice"), mm_items=(MMItem("img", 5, 20),)),
        KeyContext(group=1),
        KeyContext(parent=block_keys(TOKENS, SPEC)[1].digest),
    ]
    response = _compute(stub, *(request_to_message(TOKENS, c) for c in contexts))
    assert response.spec_fingerprint == SPEC.fingerprint
    assert [_keys(r) for r in response.results] == [block_keys(TOKENS, SPEC, c) for c in contexts]
    assert [len(r.keys) for r in response.results] == [6, 6, 6, 3, 6]
    assert all(len(k) == 32 for r in response.results for k in r.keys)
    assert not any(r.signed_event_keys for r in response.results)
    # Batches: an empty list answers an empty list; an empty prompt has no keys.
    assert list(_compute(stub).results) == []
    empty = _compute(stub, kpb.KeyRequest(), request_to_message(TOKENS[:15])).results
    assert [list(r.keys) for r in empty] == [[], []]


@pytest.mark.parametrize("profile_id", profile_ids())
def test_every_vector_over_grpc(stub, profile_id: str) -> None:
    # The authoritative path reproduces every vector of every profile, pickle ones included,
    # and refuses the inputs a profile refuses with the matching status.
    spec = _spec_for(profile_id)
    vectors = generate_vectors(spec)
    good = [v for v in vectors if v.error is None]
    signed = spec.event_encoding.startswith("i64")
    for start in range(0, len(good), 16):  # the server's max_texts_per_request
        batch = good[start : start + 16]
        response = _compute(stub, *(_wire(v.tokens, v.context) for v in batch), model=profile_id)
        for vector, result in zip(batch, response.results, strict=True):
            assert [k.hex() for k in result.keys] == list(vector.keys), vector.name
            events = result.signed_event_keys if signed else result.event_keys
            assert list(events) == list(vector.event_keys), vector.name
    codes = {"Unsupported": UNIMPLEMENTED, "InvalidArgument": INVALID}
    for vector in (v for v in vectors if v.error is not None):
        if any(t >= 1 << 32 for t in vector.tokens):
            # token_ids are uint32 on the wire: such a request cannot even be built.
            with pytest.raises(ValueError):
                _wire(vector.tokens, vector.context)
            continue
        err = _error(stub, _wire(vector.tokens, vector.context), model=profile_id)
        assert err.code() == codes[vector.error], vector.name


def _wire(tokens, context) -> kpb.KeyRequest:
    """A vector's JSON context as a message, unchecked, so the server does the refusing."""
    ctx = dict(context or {})
    fields = {k: ctx[k] for k in ("model", "cache_salt", "group") if k in ctx}
    if "adapter" in ctx:
        fields["adapter_name"] = ctx["adapter"]["name"]
        if "path" in ctx["adapter"]:
            fields["adapter_path"] = ctx["adapter"]["path"]
    if "parent" in ctx:
        fields["parent"] = bytes.fromhex(ctx["parent"])
    fields["prompt_embeds_digests"] = [
        bytes.fromhex(d) for d in ctx.get("prompt_embeds_digests", ())
    ]
    fields["mm_items"] = [kpb.MultimodalItem(**m) for m in ctx.get("mm_items", ())]
    return kpb.KeyRequest(token_ids=list(tokens), context=kpb.KeyContext(**fields))


def test_sglang_events_are_signed(stub) -> None:
    # SGLang events carry the first 8 digest bytes as a signed int64 (hash_str_to_int64).
    rng = random.Random(5)
    tokens = [rng.randrange(151_936) for _ in range(640)]
    result = _compute(stub, request_to_message(tokens), model="sglang/sha256@0.5.23").results[0]
    assert not result.event_keys and len(result.signed_event_keys) == 40
    assert list(result.signed_event_keys) == [
        int.from_bytes(k[:8], "big", signed=True) for k in result.keys
    ]
    assert min(result.signed_event_keys) < 0


def _ctx(**fields) -> kpb.KeyContext:
    return kpb.KeyContext(**fields)


def _digest(i: int) -> bytes:
    return hashlib.sha256(f"block {i}".encode()).digest()


# (case, model, context, code, text the message must contain, field named in the metadata)
BAD_CONTEXTS = [
    ("model empty", "", _ctx(model=""), INVALID, "model must not be empty", "context.model"),
    (
        "model missing for llm-d",
        "llmd/cbor-fnv64@0.10",
        None,
        INVALID,
        "set context.model",
        "context.model",
    ),
    (
        "adapter path without name",
        "",
        _ctx(adapter_path="/a"),
        INVALID,
        "without adapter_name",
        "context.adapter_path",
    ),
    (
        "adapter without the path the tagged era hashes",
        "",
        _ctx(adapter_name="alice"),
        INVALID,
        "adapter path",
        "context.adapter_path",
    ),
    (
        "adapter name empty",
        "",
        _ctx(adapter_name=""),
        INVALID,
        "must not be empty",
        "context.adapter_name",
    ),
    (
        "adapter on a profile that cannot key it",
        "sglang/sha256@0.5.23",
        _ctx(adapter_name="alice"),
        UNIMPLEMENTED,
        "does not key LoRA adapters",
        "context.adapter_name",
    ),
    ("salt empty", "", _ctx(cache_salt=""), INVALID, "non-empty", "context.cache_salt"),
    ("salt with '/'", "", _ctx(cache_salt="a/b"), INVALID, "'/'", "context.cache_salt"),
    ("salt too long", "", _ctx(cache_salt="s" * 129), INVALID, "at most 128", "context.cache_salt"),
    (
        "mm identifier empty",
        "",
        _ctx(mm_items=[kpb.MultimodalItem(identifier="", offset=0, length=3)]),
        INVALID,
        "mm_items[0]",
        "context.mm_items",
    ),
    (
        "mm length 0",
        "",
        _ctx(mm_items=[kpb.MultimodalItem(identifier="img", offset=0, length=0)]),
        INVALID,
        "length 0",
        "context.mm_items",
    ),
    (
        "mm items overlap",
        "",
        _ctx(
            mm_items=[
                kpb.MultimodalItem(identifier="a", offset=0, length=10),
                kpb.MultimodalItem(identifier="b", offset=5, length=2),
            ]
        ),
        INVALID,
        "must not overlap",
        "context.mm_items",
    ),
    (
        "mm items out of order",
        "",
        _ctx(
            mm_items=[
                kpb.MultimodalItem(identifier="a", offset=20, length=1),
                kpb.MultimodalItem(identifier="b", offset=5, length=2),
            ]
        ),
        INVALID,
        "sorted by offset",
        "context.mm_items",
    ),
    (
        "mm on a profile that cannot key it",
        "sglang/sha256@0.5.23",
        _ctx(mm_items=[kpb.MultimodalItem(identifier="img", offset=0, length=3)]),
        UNIMPLEMENTED,
        "multimodal items",
        "context.mm_items",
    ),
    (
        "prompt embeds digest of 31 bytes",
        "",
        _ctx(prompt_embeds_digests=[b"x" * 31]),
        INVALID,
        "must be 32 bytes",
        "context.prompt_embeds_digests",
    ),
    (
        "fewer prompt embeds digests than blocks",
        "",
        _ctx(prompt_embeds_digests=[_digest(0), _digest(1)]),
        INVALID,
        "2 entries for 6 full blocks",
        "context.prompt_embeds_digests",
    ),
    (
        "prompt embeds on a profile that cannot key them",
        "dynamo/xxh3@1.6",
        _ctx(prompt_embeds_digests=[_digest(i) for i in range(6)]),
        UNIMPLEMENTED,
        "prompt embeddings",
        "context.prompt_embeds_digests",
    ),
    ("group not in the spec", "", _ctx(group=5), INVALID, "group 5", "context.group"),
    (
        # Every profile keys each group its spec lists; another index is a bad argument.
        "group on a single-group profile",
        "sglang/sha256@0.5.23",
        _ctx(group=1),
        INVALID,
        "group 1 is not in this spec",
        "context.group",
    ),
    ("parent empty", "", _ctx(parent=b""), INVALID, "non-empty digest", "context.parent"),
    (
        "parent of the wrong length",
        "",
        _ctx(parent=b"p" * 16),
        INVALID,
        "32-byte sha256_cbor block digest, got 16",
        "context.parent",
    ),
    (
        "parent of the wrong length (Dynamo)",
        "dynamo/xxh3@1.6",
        _ctx(parent=b"p" * 32),
        INVALID,
        "8-byte",
        "context.parent",
    ),
]


@pytest.mark.parametrize(
    ("model", "context", "code", "text", "field"),
    [case[1:] for case in BAD_CONTEXTS],
    ids=[case[0] for case in BAD_CONTEXTS],
)
def test_bad_context_fields(stub, model, context, code, text, field) -> None:
    good = request_to_message(TOKENS, KeyContext(model="m") if model.startswith("llmd") else None)
    bad = kpb.KeyRequest(token_ids=TOKENS)
    if context is not None:
        bad.context.CopyFrom(context)
    # The bad request is the second: the error names it, and nothing is answered.
    err = _error(stub, good, bad, model=model)
    assert err.code() == code
    assert text in err.details()
    assert err.details().startswith(f"requests[1].{field.split('.')[0]}")
    metadata = dict(err.trailing_metadata())
    assert metadata["tokenkeys-field"].startswith("requests[1].")
    assert metadata["tokenkeys-field"].endswith(field)


def test_stale_tokenizer_fingerprint(stub) -> None:
    info = stub.GetTokenizerInfo(tpb.GetTokenizerInfoRequest())
    ok = _ctx(tokenizer_fingerprint=info.fingerprint)
    assert len(_compute(stub, kpb.KeyRequest(token_ids=TOKENS, context=ok)).results) == 1
    stale = _ctx(tokenizer_fingerprint="0" * 64)
    err = _error(stub, kpb.KeyRequest(token_ids=TOKENS, context=stale))
    assert err.code() == PRECONDITION
    assert "requests[0].context.tokenizer_fingerprint" in err.details()
    assert dict(err.trailing_metadata())["tokenkeys-fingerprint"] == info.fingerprint


def test_stale_expected_spec_fingerprint(stub) -> None:
    ok = _compute(stub, request_to_message(TOKENS), expected_spec_fingerprint=SPEC.fingerprint)
    assert len(ok.results) == 1
    other = make_spec("vllm/sha256_cbor@0.31", 32)
    err = _error(stub, request_to_message(TOKENS), expected_spec_fingerprint=other.fingerprint)
    assert err.code() == PRECONDITION
    assert SPEC.fingerprint in err.details() and "GetCacheKeySpec" in err.details()
    metadata = dict(err.trailing_metadata())
    assert metadata["tokenkeys-spec-fingerprint"] == SPEC.fingerprint
    assert metadata["tokenkeys-field"] == "expected_spec_fingerprint"


def test_limits_and_unknown_model(stub) -> None:
    err = _error(stub, *[request_to_message(TOKENS)] * 17)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "at most 16" in err.details()
    err = _error(stub, *[request_to_message([1] * 100_000)] * 4)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "400000 tokens; at most 300000" in err.details()
    err = _error(stub, request_to_message(TOKENS), model="llama-70b")
    assert err.code() == grpc.StatusCode.NOT_FOUND and "served models" in err.details()
    err = _error(stub, request_to_message(TOKENS), model="no-keys")
    assert err.code() == UNIMPLEMENTED and "--cache-key-profile" in err.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.GetCacheKeySpec(kpb.GetCacheKeySpecRequest(model="no-keys"))
    assert info.value.code() == UNIMPLEMENTED


def test_large_call_runs_off_the_event_loop_and_stays_exact(stub) -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(151_936) for _ in range(40_000)]
    ctx = KeyContext(adapter=Adapter("a", "/a"), cache_salt="s")
    result = _compute(stub, request_to_message(tokens, ctx)).results[0]
    assert _keys(result) == block_keys(tokens, SPEC, ctx)


def test_concurrent_clients_get_exact_keys(server) -> None:
    rng = random.Random(11)
    prompts = [[rng.randrange(151_936) for _ in range(rng.randrange(300))] for _ in range(24)]
    want = [block_keys(p, SPEC) for p in prompts]

    def work(seed: int) -> None:
        channel = grpc.insecure_channel(server.target)
        stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
        r = random.Random(seed)
        for _ in range(5):
            pick = r.sample(range(len(prompts)), 4)
            got = _compute(stub, *(request_to_message(prompts[i]) for i in pick)).results
            assert [_keys(g) for g in got] == [want[i] for i in pick]
        channel.close()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(work, s) for s in range(8)]:
            f.result()


def test_every_u32_token_id_is_keyed(stub) -> None:
    # Token ids are any u32 (SGLang multimodal pad values lie outside every vocabulary).
    tokens = [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1] * 4
    result = _compute(stub, request_to_message(tokens)).results[0]
    assert _keys(result) == block_keys(tokens, SPEC)
