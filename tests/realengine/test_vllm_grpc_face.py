"""The judge: vLLM 0.32's own ``--grpc`` server and tokenkeys' VllmEngine face, same requests.

Two faces of the same tiny model with the same engine options: vLLM's ``--grpc`` server
(smg-grpc-servicer 0.14.1 over AsyncLLM, :mod:`vllm_grpc_server`) and ``tokenkeys serve
--vllm-engine-face`` as the sidecar of the harness's HTTP vLLM. Each test sends both the same
request and compares the answers field by field: model and server facts, Generate (the same
seed gives the same tokens; prompt and cached counts), the tokenizer bundle's files, and the
KV events of the same prompt. Where the faces differ by construction the test names it.
"""

from __future__ import annotations

import io
import random
import zipfile
from collections.abc import Iterator

import grpc
import pytest
from evidence import unavailable
from google.protobuf.json_format import MessageToDict

from cached_venv import VenvUnavailable
from served_pair import TokenkeysServe, sidecar_args
from smg_stubs import require_smg_stubs
from vllm_grpc_env import vllm_grpc_python
from vllm_grpc_server import VllmGrpcServer
from vllm_server import BLOCK_SIZE, PLAIN_CONFIG, VllmServer

require_smg_stubs()

from tokenkeys.server.grpc.vllm_engine.stubs import (  # noqa: E402
    common_pb2,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

pb = vllm_engine_pb2
VOCAB = 49152
READ_LIMIT_S = 120.0  # a guard against a wedged stream, never a criterion
#: Both faces' engine: the harness's default without the adapter (--lora-modules is an option of
#: vLLM's OpenAI frontend, which the gRPC launcher does not take, and VllmEngine names no
#: adapter). A server of its own for the sidecar, too, not the shared default one that earlier
#: test files have used: the two engines start alike, so an idle one's loads compare (the
#: schedule runs this module first on that server: the first of its configuration's modules).
CONFIG = PLAIN_CONFIG

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(CONFIG)]


@pytest.fixture(scope="module")
def judge(tiny_model, tmp_path_factory) -> Iterator[VllmGrpcServer]:
    try:
        python = vllm_grpc_python()
    except VenvUnavailable as exc:
        unavailable(f"no vLLM --grpc environment: {exc}")
    server = VllmGrpcServer(python, tiny_model, CONFIG, tmp_path_factory.mktemp("grpc"))
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def face(vllm_pool) -> Iterator[TokenkeysServe]:
    vllm: VllmServer = vllm_pool.get(CONFIG)
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


def fields(message) -> dict:
    """A message as a dict of its set fields (a proto3 scalar left 0 is absent on both sides)."""
    return MessageToDict(message, preserving_proto_field_name=True)


#: GetModelInfo fields that differ by construction: vLLM names its model folder, the face the
#: tokenizer folder it serves; the face has no weights, so no model type or architecture.
MODEL_DIFFERS = ("model_path", "tokenizer_path", "model_type", "architectures")


def test_model_info_answers_as_vllm(stubs):
    theirs, ours = (fields(s.GetModelInfo(pb.GetModelInfoRequest())) for s in stubs)
    assert theirs["architectures"] and "architectures" not in ours and "model_type" not in ours
    for name in MODEL_DIFFERS:
        theirs.pop(name, None), ours.pop(name, None)
    assert ours == theirs


#: GetServerInfo fields vLLM fills from its own configuration (smg-grpc-servicer's
#: ``server_facts``) that a tokenkeys engine does not know, left empty (the proto's "unknown"):
#: the KV and weight dtypes, ``max_num_seqs`` (the Engine Protocol has no running-request cap),
#: the ``/dev/shm`` identity and encoder dtype (for media tensors, which the face refuses),
#: where constrained decoding starts (structured output is refused) and the attention backend.
SERVER_UNKNOWN = (
    "kv_cache_dtype",
    "model_dtype",
    "max_num_seqs",
    "shm_namespace_id",
    "multimodal_encoder_dtype",
    "constrained_decoding_start",
    "attention_backend",
)


def test_server_info_answers_as_vllm_but_what_names_vllms_configuration(stubs):
    theirs, ours = (fields(s.GetServerInfo(pb.GetServerInfoRequest())) for s in stubs)
    assert not set(ours) & set(SERVER_UNKNOWN)
    assert {k: v for k, v in theirs.items() if k not in SERVER_UNKNOWN} == ours
    assert (ours["block_size"], ours["data_parallel_size"]) == (BLOCK_SIZE, 1)


#: GetLoads fields that differ by construction: the time of the answer, the serving software's
#: version (vLLM's release; ``tokenkeys-<version>``), ``max_running_requests`` (vLLM's
#: ``max_num_seqs``, unknown here); the servicer's own estimates (``gen_throughput``,
#: ``cache_hit_rate``, ``num_waiting_uncached_tokens``) follow each server's history of requests
#: (vLLM's servicer counts its warm-up), so their rules are tested on a clock
#: (tests/server/test_vllm_engine_load_estimate.py) rather than compared here.
LOADS_DIFFER = ("timestamp", "version")
RANK_DIFFERS = ("max_running_requests", "gen_throughput", "cache_hit_rate")


def test_loads_and_health_of_an_idle_engine_answer_as_vllm(stubs):
    answers = []
    for stub in stubs:
        health = fields(stub.HealthCheck(pb.HealthCheckRequest()))
        loads = fields(stub.GetLoads(pb.GetLoadsRequest()))
        assert loads["timestamp"] and loads["version"]
        for name in LOADS_DIFFER:
            del loads[name]
        for name in RANK_DIFFERS:
            loads["loads"][0].pop(name, None)
        answers.append((health, loads))
    theirs, ours = answers
    assert ours == theirs
    assert ours[0] == {"healthy": True, "message": "Health"}


def test_generate_answers_as_vllm_step_by_step(stubs):
    ids = prompt(1)
    answers = []
    for stub in stubs:
        first = generate(stub, ids, stream=False, rid="same-1")
        again = generate(stub, ids, stream=True, rid="same-2")
        fresh = generate(stub, prompt(3), stream=True, rid="same-3")
        answers.append([[fields(m) for m in a] for a in (first, again, fresh)])
    theirs, ours = answers
    cached = (len(ids) - 1) // BLOCK_SIZE * BLOCK_SIZE
    # Not streamed: one complete, every field the same (the same seed gives the same tokens).
    assert ours[0] == theirs[0]
    assert theirs[0][0]["complete"]["completion_tokens"] == 8
    # A fresh prompt streamed: the same tokens, the same fields, nothing cached.
    assert streamed(ours[2]) == streamed(theirs[2])
    assert not any(m["chunk"].get("cached_tokens") for m in theirs[2][:-1] + ours[2][:-1])
    # The cached prompt streamed: vLLM's output processor sets ``num_cached_tokens`` at the
    # prompt's first output and every later RequestOutput carries it, so each chunk reports the
    # cached count (smg-grpc-servicer ``_chunk_response``: ``output.num_cached_tokens``).
    assert {m["chunk"]["cached_tokens"] for m in theirs[1][:-1]} == {cached}
    assert theirs[1][-1]["complete"]["cached_tokens"] == cached
    # By construction, in front of vLLM's HTTP server: vLLM 0.32's streamed completions carry
    # the count only in the final usage chunk (``completion/serving.py``: read at the first
    # output, sent in ``final_usage_info``; continuous usage stats leave it out), so the sidecar
    # learns it with the last token: the last chunk and the complete carry it, the chunks before
    # it 0. Every other field is the same.
    assert {m["chunk"].get("cached_tokens", 0) for m in ours[1][:-2]} == {0}
    assert ours[1][-2]["chunk"]["cached_tokens"] == cached
    assert streamed(ours[1]) == streamed(theirs[1])


def streamed(messages: list[dict]) -> tuple[list[int], dict, set[tuple]]:
    """A streamed answer without how its tokens were cut into chunks: its tokens in order, its
    complete without the last step's tokens, and the other fields of its chunks. The cut is
    timing: vLLM's output collector merges the steps its client has not read yet into one
    output (two tokens in one chunk, seen in a whole run), the face relays one per step. Each
    chunk counts its own tokens, and the complete repeats the last chunk's (the streamed rule).
    """
    chunks, done = [m["chunk"] for m in messages[:-1]], dict(messages[-1]["complete"])
    for chunk in chunks:
        assert chunk.get("completion_tokens", 0) == len(chunk.get("token_ids", []))
    assert done.pop("output_ids", []) == chunks[-1].get("token_ids", [])
    assert done.pop("completion_tokens", 0) == len(chunks[-1].get("token_ids", []))
    tokens = [t for c in chunks for t in c.get("token_ids", [])]
    counted = ("token_ids", "completion_tokens", "cached_tokens")
    rest = {tuple(sorted((k, v) for k, v in c.items() if k not in counted)) for c in chunks}
    return tokens, done, rest


def test_a_stop_token_is_matched_as_vllm_matches_it(stubs):
    ids = prompt(4)
    answers = []
    for stub in stubs:
        (free,) = generate(stub, ids, stream=False, rid="free")
        stop = free.complete.output_ids[2]
        request = pb.GenerateRequest(
            request_id="stop",
            tokenized=pb.TokenizedInput(input_ids=ids),
            sampling_params=pb.SamplingParams(max_tokens=8, seed=7, stop_token_ids=[stop]),
        )
        answers.append([fields(m) for m in stub.Generate(request, timeout=READ_LIMIT_S)])
    theirs, ours = answers
    assert ours == theirs
    assert theirs[0]["complete"]["finish_reason"] == "stop"
    assert "matched_token_id" in theirs[0]["complete"]


def test_abort_ends_a_stream_as_vllm_ends_it(stubs):
    # Far more tokens than a CPU vLLM makes before Abort lands (a guard, never a criterion:
    # the test reads that both ended with "abort").
    endings = []
    for n, stub in enumerate(stubs):
        request = pb.GenerateRequest(
            request_id=f"abort-{n}",
            tokenized=pb.TokenizedInput(input_ids=prompt(5)),
            sampling_params=pb.SamplingParams(max_tokens=3000, ignore_eos=True),
            stream=True,
        )
        call = stub.Generate(request, timeout=READ_LIMIT_S)
        assert next(call).HasField("chunk")
        stub.Abort(pb.AbortRequest(request_ids=[f"abort-{n}", "never-sent"]))
        rest = [fields(m) for m in call]
        endings.append(rest[-2:])
    # Both end with one last chunk, then the complete with finish reason "abort" repeating that
    # chunk's tokens (the streamed rule). vLLM's last output carries the tokens its engine made
    # after the last output the client read (AsyncLLM's output collector merges them into the
    # aborted one): none when Abort lands between two steps, the latest step's when it lands
    # after it. Which of the two a run sees is timing, so the tokens compare only when vLLM's
    # last chunk has none; the face ends an abort with an empty chunk.
    for last, done in endings:
        assert done["complete"]["finish_reason"] == "abort"
        assert done["complete"].get("output_ids", []) == last["chunk"].get("token_ids", [])
        assert last["chunk"]["prompt_tokens"] == done["complete"]["prompt_tokens"]
    theirs, ours = endings
    if "token_ids" in theirs[0]["chunk"]:
        theirs, ours = without_tokens(theirs), without_tokens(ours)
    assert ours == theirs


def without_tokens(ending: list[dict]) -> list[dict]:
    """An aborted stream's ending without the fields that count its last step's tokens."""
    drop = {"token_ids", "output_ids", "completion_tokens"}
    return [
        {kind: {k: v for k, v in m[kind].items() if k not in drop}} for m in ending for kind in m
    ]


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
