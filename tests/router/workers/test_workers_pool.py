"""Pool admission rules and the key context a pool completes, without a network."""

from __future__ import annotations

import pytest

from tokenkeys.errors import FailedPrecondition, Unsupported
from tokenkeys.keys import KeyContext, make_spec
from tokenkeys.keys.strategy import KeyStrategy
from tokenkeys.preprocess import Preprocessor
from tokenkeys.router.workers.discovery import EventSource, KeySpecRef, ModelDescription
from tokenkeys.router.workers.pool import Pool, choose_source, index_worker_id
from tokenkeys.tokenizer import Tokenizer, default_tokenizer_path

SPEC = make_spec("vllm/sha256_cbor@0.31", 16)
REF = KeySpecRef(SPEC.profile_id, SPEC.fingerprint, True)
OTHER = KeySpecRef(SPEC.profile_id, "f" * 64, True)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.load(default_tokenizer_path())


def source(transport: str, spec: KeySpecRef | None = REF) -> EventSource:
    endpoint = "tcp://127.0.0.1:5557" if transport == "zmq" else "127.0.0.1:50051"
    return EventSource(transport, endpoint, "kv@x@m", spec)


def model(fingerprint: str, spec: KeySpecRef | None = REF, sources=None) -> ModelDescription:  # noqa: ANN001
    return ModelDescription(
        name="m",
        fingerprint=fingerprint,
        key_spec=spec,
        artifacts_available=True,
        remote_key_computation=True,
        tokenizer_endpoint="127.0.0.1:50051",
        max_context_length=None,
        sources=tuple(sources if sources is not None else [source("zmq"), source("grpc")]),
    )


def make_pool(tokenizer: Tokenizer, spec=SPEC, transport: str = "auto") -> Pool:  # noqa: ANN001
    ref = KeySpecRef(spec.profile_id, spec.fingerprint, True)
    return Pool(
        "m", ref, tokenizer, Preprocessor(tokenizer), KeyStrategy(spec), transport=transport
    )


def test_refusal_reasons(tokenizer):
    pool = make_pool(tokenizer)
    fp = tokenizer.fingerprint
    assert pool.refusal("a:1", "i1", model(fp)) is None
    assert pool.refusal("a:1", "i1", model("0" * 64)).reason == "tokenizer_fingerprint"
    assert pool.refusal("a:1", "i1", model(fp, spec=None)).reason == "no_key_spec"
    assert pool.refusal("a:1", "i1", model(fp, spec=OTHER)).reason == "key_spec"
    foreign_sources = [source("zmq", OTHER), source("grpc", None)]
    assert pool.refusal("a:1", "i1", model(fp, sources=foreign_sources)).reason == (
        "no_event_source"
    )
    pool.join("a:1", "i1", source("zmq"))
    refusal = pool.refusal("b:2", "i1", model(fp))
    assert refusal.reason == "duplicate_instance" and "a:1" in refusal.message
    assert pool.refusal("a:1", "i1", model(fp)) is None  # itself, again


def test_sources_follow_the_transport_preference():
    m = model("x")
    assert choose_source(m, REF).transport == "zmq"
    assert choose_source(m, REF, "grpc").transport == "grpc"
    assert choose_source(model("x", sources=[source("grpc")]), REF).transport == "grpc"
    assert choose_source(model("x", sources=[source("zmq", OTHER)]), REF) is None


def test_the_key_context_is_completed_as_the_engine_completes_it(tokenizer):
    assert make_pool(tokenizer).key_context(None) is None
    # llm-d's request keys hash the model name: the pool's name unless the request gives one.
    pool = make_pool(tokenizer, make_spec("llmd/cbor-fnv64@0.10", 16))
    assert pool.key_context(None).model == "m"
    assert pool.key_context(KeyContext(model="x")).model == "x"
    # A hybrid model: the first prefix-reusable group is indexed, at its own block size.
    hybrid = make_spec(
        "vllm/sha256_cbor@0.31",
        None,
        groups=[
            {"kind": "full_attention", "block_size": 16},
            {"kind": "full_attention", "block_size": 32},
        ],
    )
    pool = make_pool(tokenizer, hybrid)
    assert (pool.group_idx, pool.block_size) == (0, 16)
    two_sizes = make_spec(
        "vllm/sha256_cbor@0.31", None, groups=[{"kind": "mamba", "block_size": 16}, 32]
    )
    pool = make_pool(tokenizer, make_spec("vllm/sha256_cbor@0.31", 16, groups=[16, 32]))
    assert pool.key_context(None) is None
    windowed = make_spec(
        "vllm/sha256_cbor@0.31",
        16,
        groups=[
            {"kind": "sliding_window", "block_size": 32, "sliding_window": 64},
            {"kind": "full_attention", "block_size": 32},
        ],
    )
    pool = make_pool(tokenizer, windowed)
    assert (pool.group_idx, pool.block_size) == (1, 32)
    assert [(w.index, w.need) for w in pool.layout.windows] == [(0, 2)]
    assert pool.key_context(KeyContext(cache_salt="s")) == KeyContext(cache_salt="s", group=1)
    big = make_spec(
        "vllm/sha256_cbor@0.31",
        16,
        groups=[
            {"kind": "sliding_window", "block_size": 16, "sliding_window": 64},
            {"kind": "full_attention", "block_size": 32},
        ],
    )
    for spec, named in ((two_sizes, "'mamba'"), (big, "16-token blocks")):
        with pytest.raises(Unsupported, match=named):
            make_pool(tokenizer, spec)


async def test_block_keys_are_the_event_keys_of_the_spec(tokenizer):
    from tokenkeys.keys import block_keys

    pool = make_pool(tokenizer)
    ids = list(range(100, 150))
    assert await pool.block_keys(ids) == [k.event_key for k in block_keys(ids, SPEC)]


@pytest.mark.parametrize(
    "spec",
    [
        SPEC,
        make_spec("vllm/xxhash_cbor@0.31", 16, root_seed="0"),
        make_spec("sglang/sha256@0.5.23", 16),  # signed event keys: index keys modulo 2**64
        make_spec("llmd/cbor-fnv64@0.10", 16),  # the pool's model name in the context
        make_spec("dynamo/xxh3@1.6", 16),
        make_spec("vllm/sha256_cbor@0.31", 16, groups=[16, 32]),  # a group's own block size
    ],
    ids=lambda spec: f"{spec.profile_id}/{len(spec.groups)}",
)
async def test_block_keys_through_the_key_array_are_the_index_keys_of_block_keys(tokenizer, spec):
    # The pool reads the compiled chain's buffer (KeyStrategy.compute_array); the reference is
    # the per-block objects of block_keys, each made an index key as the events' keys are.
    from tokenkeys.keys import block_keys
    from tokenkeys.router.index.model import prompt_keys

    pool = make_pool(tokenizer, spec)
    rng = __import__("random").Random(5)
    for n in (0, 15, 16, 200, 1000):
        ids = [rng.randrange(50_000) for _ in range(n)]
        context = KeyContext(cache_salt="s") if n == 200 else None
        want = prompt_keys(block_keys(ids, spec, pool.key_context(context)))
        got = await pool.block_keys(ids, context)
        assert type(got) is list and got == want


def test_a_pool_needs_computable_keys_of_the_advertised_spec(tokenizer):
    pickle = make_spec("vllm/sha256@0.31", 16)
    with pytest.raises(FailedPrecondition, match="cannot be computed"):
        Pool("m", REF, tokenizer, Preprocessor(tokenizer), KeyStrategy(pickle))
    with pytest.raises(FailedPrecondition, match="advertised"):
        Pool("m", OTHER, tokenizer, Preprocessor(tokenizer), KeyStrategy(SPEC))


def test_index_worker_ids_name_address_and_model():
    assert index_worker_id("10.0.0.7:50051", "Qwen/Qwen3-0.6B") == "10.0.0.7:50051@Qwen/Qwen3-0.6B"
