"""The judge: vLLM 0.32's own ``--grpc`` server and tokenkeys' VllmEngine face, same requests.

Two faces of the same tiny model with the same engine options: vLLM's ``--grpc`` server
(smg-grpc-servicer 0.14.1 over AsyncLLM, :mod:`vllm_grpc_server`) and ``tokenkeys serve
--vllm-engine-face`` as the sidecar of the harness's HTTP vLLM. Each test sends both the same
request and compares the answers field by field: model and server facts, Generate (the same
seed gives the same tokens; prompt and cached counts), the tokenizer bundle's files, and the
KV events of the same prompt. Where the faces differ by construction the test names it.
"""

from __future__ import annotations

import dataclasses
import io
import random
import zipfile
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from cached_venv import VenvUnavailable
from served_pair import TokenkeysServe, sidecar_args
from smg_stubs import require_smg_stubs
from vllm_grpc_env import vllm_grpc_python
from vllm_grpc_server import VllmGrpcServer
from vllm_server import BLOCK_SIZE, DEFAULT_CONFIG, VllmServer

require_smg_stubs()

from tokenkeys._gen_smg import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc  # noqa: E402

pytestmark = pytest.mark.realengine

pb = vllm_engine_pb2
VOCAB = 49152
READ_LIMIT_S = 120.0  # a guard against a wedged stream, never a criterion


@pytest.fixture(scope="module")
def judge(tiny_model, tmp_path_factory) -> Iterator[VllmGrpcServer]:
    try:
        python = vllm_grpc_python()
    except VenvUnavailable as exc:
        pytest.skip(f"no vLLM --grpc environment: {exc}")
    # The harness's default engine without the adapter: --lora-modules is an option of vLLM's
    # OpenAI frontend, which the gRPC launcher does not take (and VllmEngine names no adapter).
    config = dataclasses.replace(DEFAULT_CONFIG, lora=False)
    server = VllmGrpcServer(python, tiny_model, config, tmp_path_factory.mktemp("grpc"))
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def face(vllm_pool) -> Iterator[TokenkeysServe]:
    vllm: VllmServer = vllm_pool.get(DEFAULT_CONFIG)
    process = TokenkeysServe(*sidecar_args(vllm, "--vllm-engine-face"))
    try:
        process.wait_healthy()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def stubs(judge, face) -> Iterator[tuple[vllm_engine_pb2_grpc.VllmEngineStub, ...]]:
    channels = [grpc.insecure_channel(s.target) for s in (judge, face)]
    yield tuple(vllm_engine_pb2_grpc.VllmEngineStub(c) for c in channels)
    for channel in channels:
        channel.close()


def prompt(seed: int, length: int = 100) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(length)]


def generate(stub, ids: list[int], *, stream: bool, rid: str) -> list[pb.GenerateResponse]:
    request = pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(max_tokens=8, seed=7, ignore_eos=True),
        stream=stream,
    )
    return list(stub.Generate(request, timeout=READ_LIMIT_S))


MODEL_FIELDS = (
    "served_model_name",
    "is_generation",
    "max_context_length",
    "max_req_input_len",
    "vocab_size",
    "supports_vision",
    "eos_token_ids",
    "bos_token_id",
    "pad_token_id",
    "default_sampling_params_json",
)


def test_model_info_answers_as_vllm(stubs):
    theirs, ours = (s.GetModelInfo(pb.GetModelInfoRequest()) for s in stubs)
    for name in MODEL_FIELDS:
        assert getattr(ours, name) == getattr(theirs, name), name
    # By construction: vLLM names its model folder and architecture; the face names the
    # tokenizer folder it serves and leaves the architecture unknown (no weights here).
    assert theirs.architectures and not ours.architectures


def test_server_info_names_the_same_block_size_and_one_rank(stubs):
    theirs, ours = (s.GetServerInfo(pb.GetServerInfoRequest()) for s in stubs)
    assert (ours.block_size, ours.data_parallel_size) == (theirs.block_size, 1) == (BLOCK_SIZE, 1)


def test_generate_answers_as_vllm_and_counts_the_same_cached_prompt(stubs):
    ids = prompt(1)
    answers = []
    for stub in stubs:
        first = generate(stub, ids, stream=False, rid="same-1")
        again = generate(stub, ids, stream=True, rid="same-2")
        answers.append((first, again))
    (theirs_first, theirs_again), (ours_first, ours_again) = answers
    (t,), (o,) = theirs_first, ours_first
    assert list(o.complete.output_ids) == list(t.complete.output_ids)
    for name in ("finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"):
        assert getattr(o.complete, name) == getattr(t.complete, name), name
    assert o.complete.cached_tokens == 0
    # Streamed: the same tokens step by step, one complete after them, the prompt now cached.
    assert [m.WhichOneof("response") for m in ours_again][-1] == "complete"
    tokens = [
        [t for m in a if m.HasField("chunk") for t in m.chunk.token_ids]
        for a in answers[0][1:] + answers[1][1:]
    ]
    assert tokens[0] == tokens[1] == list(t.complete.output_ids)
    assert ours_again[-1].complete.cached_tokens == theirs_again[-1].complete.cached_tokens
    assert ours_again[-1].complete.cached_tokens == (len(ids) - 1) // BLOCK_SIZE * BLOCK_SIZE


def test_the_tokenizer_bundle_holds_the_same_tokenizer_files(stubs):
    archives = []
    for stub in stubs:
        chunks = list(stub.GetTokenizer(common_pb2.GetTokenizerRequest()))
        assert chunks[-1].sha256 and not any(c.sha256 for c in chunks[:-1])
        archives.append(zipfile.ZipFile(io.BytesIO(b"".join(c.data for c in chunks))))
    theirs, ours = archives
    for name in ours.namelist():
        assert ours.read(name) == theirs.read(name), name
    # vLLM zips the model folder, its configs with it; the face serves the tokenizer folder.
    assert set(theirs.namelist()) - set(ours.namelist()) <= {
        "config.json",
        "generation_config.json",
    }


def stored_of(call, ids: list[int]) -> list[common_pb2.KvCacheEvent]:
    """The stores of the first batch that caches ``ids``' first block. A subscription from 0
    replays what the stream already carried (the sidecar's start probe, earlier tests'
    prompts), so the first store on the stream need not be this prompt's."""
    head = ids[:BLOCK_SIZE]
    for batch in call:
        stored = [e for e in batch.events if e.HasField("stored")]
        if any(list(e.stored.blocks[0].token_ids) == head for e in stored if e.stored.blocks):
            return stored
    raise AssertionError("the stream ended without a store of the prompt")


def test_kv_events_of_the_same_prompt_are_the_same(stubs):
    ids = prompt(2)
    calls = [
        s.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=READ_LIMIT_S)
        for s in stubs
    ]
    for call in calls:
        call.initial_metadata()  # subscribed (both send headers at once) before the request
    for stub in stubs:
        generate(stub, ids, stream=False, rid="events")
    theirs, ours = (stored_of(call, ids) for call in calls)
    for call in calls:
        call.cancel()
    strip = [[MessageToDict(_without_event_id(e)) for e in events] for events in (theirs, ours)]
    assert strip[1] == strip[0], [_brief(s) for s in strip]
    blocks = [b for e in ours for b in e.stored.blocks]
    assert [t for b in blocks for t in b.token_ids] == ids[: len(ids) // BLOCK_SIZE * BLOCK_SIZE]


def _brief(events: list[dict]) -> list[dict]:
    """The events without their token ids (the diff a failure shows)."""
    out = []
    for event in events:
        stored = dict(event["stored"])
        stored["blocks"] = [
            {k: v for k, v in b.items() if k != "tokenIds"} | {"tokens": len(b["tokenIds"])}
            for b in stored["blocks"]
        ]
        out.append(stored)
    return out


def _without_event_id(event: common_pb2.KvCacheEvent) -> common_pb2.KvCacheEvent:
    copy = common_pb2.KvCacheEvent()
    copy.CopyFrom(event)
    copy.event_id = 0  # numbered per stream: the sidecar's stream has carried other requests
    return copy
