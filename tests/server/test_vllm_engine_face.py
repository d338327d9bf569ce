"""smg's ``VllmEngine`` face over a real loopback server with the simulated engine.

Each answer is read with the stubs compiled from smg-grpc-proto 0.4.28 (what smg 1.13 speaks)
and checked against the behaviour of smg-grpc-servicer 0.14.1 (``vllm/servicer.py``), the
servicer vLLM 0.32's ``--grpc`` runs; the real servers are compared in
``tests/realengine/test_vllm_grpc_face.py`` and real smg drives the face in
``tests/peers/test_peers_smg.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import os
import subprocess
import sys
import zipfile

import grpc
import pytest
from engine_stack import start_stack

from tokenkeys.engine.config import EngineConfig, SimulatedConfig
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.errors import ConfigError
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

from smg_stubs import require_smg_stubs
from support import REPO

require_smg_stubs()

from tokenkeys.server.grpc.vllm_engine.servicer import VllmEngineService  # noqa: E402
from tokenkeys.server.grpc.vllm_engine.stubs import common_pb2, vllm_engine_pb2_grpc  # noqa: E402
from tokenkeys.server.grpc.vllm_engine.stubs import vllm_engine_pb2 as pb  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog. " * 8


@pytest.fixture
async def stack():
    s = await start_stack(EngineConfig(), vllm_engine_face=True)
    yield s
    await s.stop()


def stub(stack) -> vllm_engine_pb2_grpc.VllmEngineStub:
    return vllm_engine_pb2_grpc.VllmEngineStub(stack.channel)


def ids_of(stack, text: str = TEXT) -> list[int]:
    return stack.models.get(None).preprocessor.tokenize_prompts([text])[0].ids


async def generate(stack, ids, *, stream: bool, **sampling) -> list[pb.GenerateResponse]:
    request = pb.GenerateRequest(
        request_id="r1",
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )
    return [m async for m in stub(stack).Generate(request)]


async def test_generate_streams_chunks_then_one_complete_and_counts_the_cached_prompt(stack):
    ids = ids_of(stack)
    first = await generate(stack, ids, stream=True, max_tokens=4, ignore_eos=True)
    kinds = [m.WhichOneof("response") for m in first]
    assert kinds == ["chunk"] * 4 + ["complete"]
    tokens = [t for m in first[:4] for t in m.chunk.token_ids]
    assert [m.chunk.completion_tokens for m in first[:4]] == [1, 1, 1, 1]
    assert {m.chunk.prompt_tokens for m in first[:4]} == {len(ids)}
    done = first[-1].complete
    # Streamed, the complete repeats the last step's tokens only (smg adds the chunks up).
    assert list(done.output_ids) == tokens[-1:] and done.completion_tokens == 1
    assert (done.finish_reason, done.prompt_tokens, done.cached_tokens) == ("length", len(ids), 0)
    second = await generate(stack, ids, stream=False, max_tokens=4, ignore_eos=True)
    (only,) = second
    assert list(only.complete.output_ids) == tokens and only.complete.completion_tokens == 4
    assert only.complete.cached_tokens == (len(ids) - 1) // 16 * 16 > 0


async def test_a_stop_token_of_the_request_is_reported_as_matched(stack):
    ids = ids_of(stack)
    (free,) = await generate(stack, ids, stream=False, max_tokens=6, ignore_eos=True)
    out = list(free.complete.output_ids)
    stop = next(t for i, t in enumerate(out) if i > 0 and t not in out[:i])
    (done,) = await generate(stack, ids, stream=False, max_tokens=6, stop_token_ids=[stop])
    assert done.complete.output_ids[-1] == stop and done.complete.finish_reason == "stop"
    assert done.complete.HasField("matched_token_id") and done.complete.matched_token_id == stop


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"n": 2}, "sampling_params.n"),
        ({"logprobs": 1}, "sampling_params.logprobs"),
        ({"stop": ["\n"]}, "sampling_params.stop"),
        ({"regex": "a+"}, "sampling_params.regex"),
        ({"min_tokens": 2}, "sampling_params.min_tokens"),
    ],
)
async def test_what_the_engine_cannot_do_exactly_is_unimplemented(stack, sampling, field):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stack, ids_of(stack), stream=False, **sampling)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert dict(info.value.trailing_metadata())["tokenkeys-field"] == field


async def test_ids_outside_the_vocabulary_are_invalid(stack):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stack, [10**9], stream=False)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_text_input_goes_through_the_models_preprocessor(stack):
    request = pb.GenerateRequest(request_id="t", text=TEXT, sampling_params=pb.SamplingParams())
    (done,) = [m async for m in stub(stack).Generate(request)]
    assert done.complete.prompt_tokens == len(ids_of(stack))


async def test_abort_ends_a_running_request_with_finish_reason_abort():
    # Decoding really waits 50 ms a token here, so the request is still running when aborted.
    slow = EngineConfig(
        engine=SimulatedConfig(latency=LatencyModel(decode_s_per_token=0.05, sleep=True))
    )
    s = await start_stack(slow, vllm_engine_face=True)
    try:
        request = pb.GenerateRequest(
            request_id="slow",
            tokenized=pb.TokenizedInput(input_ids=ids_of(s)),
            sampling_params=pb.SamplingParams(max_tokens=200, ignore_eos=True),
            stream=True,
        )
        call = stub(s).Generate(request)
        first = await call.read()
        assert first.WhichOneof("response") == "chunk"
        await stub(s).Abort(pb.AbortRequest(request_ids=["slow", "not-running"]))
        rest = []
        while (message := await call.read()) is not grpc.aio.EOF:
            rest.append(message)
        assert rest[-1].complete.finish_reason == "abort"
        assert not rest[-1].complete.output_ids
        # As vLLM's last output of an aborted request: a chunk without tokens before the end.
        assert rest[-2].HasField("chunk") and not rest[-2].chunk.token_ids
        assert rest[-2].chunk.prompt_tokens == len(ids_of(s))
        assert len(rest) < 199
    finally:
        await s.stop()


async def test_an_abort_while_grpc_writes_a_chunk_still_ends_with_finish_reason_abort():
    # grpc.aio runs a streaming handler in its call's task and writes each chunk outside the
    # handler's frame; an Abort arriving then used to cancel that task in grpc's own write, and
    # the call ended with no status at all (the client waited for its deadline: seen once
    # against a real vLLM). Driven here without grpc, the handler is held at a chunk as grpc
    # holds it while writing, and Abort comes from another task; the test's own task is the
    # call's, so a cancel of it fails the test.
    slow = EngineConfig(
        engine=SimulatedConfig(latency=LatencyModel(decode_s_per_token=0.05, sleep=True))
    )
    s = await start_stack(slow, vllm_engine_face=True)
    try:
        service = VllmEngineService(s.models, s.runtime)
        request = pb.GenerateRequest(
            request_id="held",
            tokenized=pb.TokenizedInput(input_ids=ids_of(s)),
            sampling_params=pb.SamplingParams(max_tokens=200, ignore_eos=True),
            stream=True,
        )
        responses = service.Generate(request, None)
        first = await anext(responses)
        assert first.WhichOneof("response") == "chunk"
        await asyncio.ensure_future(service.Abort(pb.AbortRequest(request_ids=["held"]), None))
        rest = [m async for m in responses]
    finally:
        await s.stop()
    assert [m.WhichOneof("response") for m in rest] == ["chunk", "complete"]
    assert not rest[0].chunk.token_ids
    assert rest[1].complete.finish_reason == "abort"


async def test_model_info_names_the_served_tokenizer(stack):
    info = await stub(stack).GetModelInfo(pb.GetModelInfoRequest())
    model = stack.models.get(None)
    assert info.served_model_name == model.name and info.is_generation
    assert info.tokenizer_path == str(model.tokenizer.folder.root) == info.model_path
    assert info.vocab_size == model.tokenizer.vocab_size
    assert list(info.eos_token_ids) == [r.id for r in model.tokenizer.specials.eos]


async def test_server_info_and_loads_report_one_rank_and_the_kv_blocks(stack):
    server = await stub(stack).GetServerInfo(pb.GetServerInfoRequest())
    engine = stack.local()
    assert (server.data_parallel_size, server.block_size) == (1, engine.block_size)
    # vLLM 0.32's servicer leaves the request counters and clocks 0; so does the face.
    assert (server.active_requests, server.uptime_seconds, server.last_receive_timestamp) == (
        0,
        0.0,
        0.0,
    )
    await generate(stack, ids_of(stack), stream=False, max_tokens=2)
    await generate(stack, ids_of(stack), stream=False, max_tokens=2)  # its prompt now cached
    loads = await stub(stack).GetLoads(pb.GetLoadsRequest())
    (rank,) = loads.loads
    used = engine.engine.used_blocks
    assert loads.dp_rank_count == 1 and rank.dp_rank == 0
    assert rank.max_total_num_tokens == engine.num_blocks * engine.block_size
    assert rank.num_used_tokens == used * engine.block_size
    assert rank.token_usage == pytest.approx(used / engine.num_blocks)
    # The servicer's estimates (load_estimate): the hit rate over the prompts finished so far
    # (every request of this stack went through the face, fewer than the 64 it averages over).
    stats = engine.engine.stats
    assert stats.cached_prompt_tokens > 0
    assert rank.cache_hit_rate == pytest.approx(stats.cached_prompt_tokens / stats.prompt_tokens)
    assert rank.num_waiting_uncached_tokens == 0
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub(stack).GetLoads(pb.GetLoadsRequest(dp_rank=1))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_health_is_healthy_until_the_server_drains(stack):
    health = await stub(stack).HealthCheck(pb.HealthCheckRequest())
    assert (health.healthy, health.message) == (True, "Health")


async def test_get_tokenizer_is_a_reproducible_zip_of_the_served_files_with_sha_on_the_last(stack):
    chunks = [c async for c in stub(stack).GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert chunks and all(not c.sha256 for c in chunks[:-1])
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    folder = stack.models.get(None).tokenizer.folder
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert sorted(archive.namelist()) == sorted(folder.contents)
        for name in archive.namelist():
            assert archive.read(name) == folder.contents[name]
    again = [c async for c in stub(stack).GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert again[-1].sha256 == chunks[-1].sha256


async def _batches(call, count: int) -> list[common_pb2.KvEventBatch]:
    return [await asyncio.wait_for(call.read(), 5) for _ in range(count)]


async def test_kv_events_replay_from_zero_and_resume_from_a_sequence_number(stack):
    # The next number: only the run's opening AllBlocksCleared (at origin - 1) is published.
    origin = stack.local().stream.next_seq
    ids = ids_of(stack)
    await generate(stack, ids, stream=False, max_tokens=2)
    await generate(stack, ids_of(stack, TEXT + " and more text to store"), stream=False)
    call = stub(stack).SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
    cleared, first, second = await _batches(call, 3)
    call.cancel()
    assert cleared.sequence_number == origin - 1
    assert not cleared.events[0].HasField("stored")
    assert (first.sequence_number, second.sequence_number) == (origin, origin + 1)
    stored = first.events[0].stored
    assert first.events[0].event_id == cleared.events[0].event_id + 1 and first.dp_rank == 0
    assert [t for b in stored.blocks for t in b.token_ids] == ids[: len(ids) // 16 * 16]
    assert stored.tier == common_pb2.KV_CACHE_TIER_DEVICE and stored.medium == "GPU"
    assert stored.locality == common_pb2.KV_CACHE_LOCALITY_LOCAL
    assert not stored.HasField("parent_block_hash")
    resumed = stub(stack).SubscribeKvEvents(
        common_pb2.SubscribeKvEventsRequest(start_sequence_number=origin + 1)
    )
    (again,) = await _batches(resumed, 1)
    resumed.cancel()
    assert again.sequence_number == origin + 1 and again.events[0].stored.HasField(
        "parent_block_hash"
    )


async def test_a_sequence_number_no_longer_kept_is_out_of_range_and_zero_replays_what_is():
    s = await start_stack(EngineConfig(kv_events_buffer_steps=1), vllm_engine_face=True)
    try:
        origin = s.local().stream.next_seq
        for suffix in ("a", "b", "c"):  # three batches; only the last stays buffered
            await generate(s, ids_of(s, suffix + TEXT), stream=False, max_tokens=1)
        last = origin + 2
        with pytest.raises(grpc.aio.AioRpcError) as info:
            late = stub(s).SubscribeKvEvents(
                common_pb2.SubscribeKvEventsRequest(start_sequence_number=origin + 1)
            )
            await _batches(late, 1)
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert f"the oldest batch this stream holds is {last}" in info.value.details()
        # 0: what is still buffered, then live batches.
        call = stub(s).SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
        (kept,) = await _batches(call, 1)
        await generate(s, ids_of(s, "d" + TEXT), stream=False, max_tokens=1)
        (live,) = await _batches(call, 1)
        call.cancel()
        assert (kept.sequence_number, live.sequence_number) == (last, last + 1)
    finally:
        await s.stop()


async def test_embed_and_flush_cache_are_unimplemented_with_a_reason(stack):
    for call, request in (
        (stub(stack).Embed, pb.EmbedRequest()),
        (stub(stack).FlushCache, common_pb2.FlushCacheRequest()),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(request)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED and info.value.details()


async def test_a_server_of_several_models_refuses_the_face():
    models = load_models(
        [ModelSource.default(), dataclasses.replace(ModelSource.default(), name="second")],
        TokenizerOptions(),
        Limits(),
    )
    with pytest.raises(ConfigError, match="serves one model"):
        await start_stack(EngineConfig(), models=models, vllm_engine_face=True)


# A fresh interpreter in which smg-grpc-proto is absent, another release, or not importable: the
# distribution's metadata is what pip installs, so it is what the face checks first.
_METADATA = "import importlib.metadata as m; real = m.version\n"
_WITHOUT_SMG = {
    "absent": _METADATA
    + "def version(name):\n"
    + "    if name == 'smg-grpc-proto': raise m.PackageNotFoundError(name)\n"
    + "    return real(name)\n"
    + "m.version = version\n",
    "another release": _METADATA
    + "m.version = lambda name: '0.4.27' if name == 'smg-grpc-proto' else real(name)\n",
    "not importable": "import sys; sys.modules['smg_grpc_proto'] = None\n",
}


@pytest.mark.parametrize("case", sorted(_WITHOUT_SMG))
def test_without_the_pinned_smg_grpc_proto_the_face_refuses_naming_the_extra(case):
    code = _WITHOUT_SMG[case] + (
        "from tokenkeys.errors import ConfigError\n"
        "try:\n"
        "    import tokenkeys.server.grpc.vllm_engine.stubs\n"
        "except ConfigError as error:\n"
        "    print(error.message)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert "smg-grpc-proto 0.4.28" in done.stdout, done.stderr
    assert "pip install 'tokenkeys[smg]'" in done.stdout
