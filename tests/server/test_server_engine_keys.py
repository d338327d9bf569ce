"""The hashes in BlockStored events are the cache keys of the request's tokens and context.

Through the whole engine side on real sockets: Inference.Generate over gRPC, events read back
from SubscribeKvEvents (protobuf) and from the ZMQ publisher (vLLM msgpack), compared with
``tokenkeys.keys.block_keys`` (what ComputeCacheKeys answers) for the same tokens, adapter and
cache salt, for the vLLM, SGLang and Dynamo profiles.
"""

from __future__ import annotations

import grpc
import pytest
from engine_stack import GrpcEvents, start_stack, zmq_batches_until

from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys.engine.config import EngineConfig, LoraModule, SimulatedConfig
from tokenkeys.events.model import BlockStored
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.keys import Adapter, KeyContext, block_keys, make_spec

PROMPT = [(i * 37 + 11) % 40_000 + 100 for i in range(70)]  # 4 full blocks of 16 + 6 tokens
LORA = LoraModule("sql-lora", "/adapters/sql-lora", 1)

CASES = [
    # profile, block size, whether the profile keys adapters
    ("vllm/sha256_cbor@0.31", 16, True),
    ("vllm/xxhash@0.29", 16, True),
    ("sglang/sha256@0.5.23", 16, False),
    ("dynamo/xxh3@1.6", 16, True),
]


def _request(lora: bool, salt: str | None, max_tokens: int = 20) -> dict:
    request = {
        "token_ids": gen.TokenIds(ids=PROMPT),
        "stopping": gen.StoppingOptions(max_tokens=max_tokens),
    }
    if lora:
        request["lora_name"] = LORA.name
    if salt is not None:
        request["kv"] = gen.KvOptions(cache_salt=salt)
    return request


def _stored(batches) -> list[BlockStored]:
    return [e for b in batches for e in b.events if isinstance(e, BlockStored)]


def _root_seed(profile: str) -> dict:
    # xxhash roots are random in vLLM unless PYTHONHASHSEED is set; a deployment pins one.
    return {"root_seed": "42"} if profile.startswith("vllm/xxhash") else {}


@pytest.mark.parametrize("profile,block_size,keys_adapters", CASES)
@pytest.mark.parametrize("salt", [None, "tenant-1"])
async def test_block_stored_hashes_are_the_cache_keys(profile, block_size, keys_adapters, salt):
    spec = make_spec(profile, block_size, **_root_seed(profile))
    stack = await start_stack(EngineConfig(engine=SimulatedConfig(lora_modules=(LORA,))), spec=spec)
    try:
        messages = await stack.generate(**_request(keys_adapters, salt))
        outputs = [t.token_id for m in messages if m.HasField("token") for t in m.token.tokens]
        assert messages[-1].usage.completion_tokens == len(outputs) == 20
        # KV exists for the prompt and every output token but the last.
        computed = PROMPT + outputs[:-1]
        context = KeyContext(
            adapter=Adapter(LORA.name, LORA.path) if keys_adapters else None, cache_salt=salt
        )
        expected = [k.event_key for k in block_keys(computed, spec, context)]
        assert len(expected) == len(computed) // block_size == 5

        stream = stack.local().stream
        last = stream.next_seq - 1
        events = GrpcEvents(stack)
        codec = ProtobufEventCodec()
        grpc_batches = [codec.decode(b)[1] for b in await events.batches(last - stream.first_seq)]
        events.cancel()
        zmq_batches = [b for _, b in await zmq_batches_until(stack, last)]
        for batches in (grpc_batches, zmq_batches):
            stored = _stored(batches)
            assert [h for e in stored for h in e.block_hashes] == expected
            # Prefill stores the 4 full prompt blocks, a decode step fills the fifth.
            assert [len(e.block_hashes) for e in stored] == [4, 1]
            assert stored[0].parent_block_hash is None
            assert stored[1].parent_block_hash == expected[3]
            assert [t for e in stored for t in e.token_ids] == computed[: 5 * block_size]
            assert {e.lora_name for e in stored} == {LORA.name if keys_adapters else None}
            assert {e.lora_id for e in stored} == {LORA.lora_id if keys_adapters else None}
        # The gRPC batches name the spec the hashes follow.
        ref = await events_key_spec(stack)
        assert (ref.profile_id, ref.spec_fingerprint) == (spec.profile_id, spec.fingerprint)
    finally:
        await stack.stop()


async def events_key_spec(stack):
    """The key_spec of the first batch of the gRPC stream."""
    events = GrpcEvents(stack)
    try:
        (batch,) = await events.batches(1)
        return batch.key_spec
    finally:
        events.cancel()


async def test_vllm_event_extra_keys_carry_adapter_name_and_first_block_salt():
    spec = make_spec("vllm/sha256_cbor@0.31", 16)
    stack = await start_stack(EngineConfig(engine=SimulatedConfig(lora_modules=(LORA,))), spec=spec)
    try:
        await stack.generate(**_request(True, "tenant-1", max_tokens=1))
        events = GrpcEvents(stack)
        (batch,) = await events.batches(1)
        events.cancel()
        (event,) = ProtobufEventCodec().decode(batch)[1].events
        # vLLM 0.31+ to_event_extra_keys: untagged (lora name, then the salt on block 0 only).
        assert event.extra_keys == (
            ("sql-lora", "tenant-1"),
            ("sql-lora",),
            ("sql-lora",),
            ("sql-lora",),
        )
        zmq = await zmq_batches_until(stack, stack.local().stream.next_seq - 1)
        assert zmq[-1][1].events[0].extra_keys == event.extra_keys
    finally:
        await stack.stop()


async def test_salt_and_adapter_isolate_prefix_reuse():
    spec = make_spec("vllm/sha256_cbor@0.31", 16)
    stack = await start_stack(EngineConfig(engine=SimulatedConfig(lora_modules=(LORA,))), spec=spec)
    try:
        cached = []
        for lora, salt in [(False, None), (False, None), (False, "a"), (True, "a"), (True, "a")]:
            messages = await stack.generate(**_request(lora, salt, max_tokens=1))
            cached.append(messages[-1].usage.cached_prompt_tokens)
        assert cached == [0, 64, 0, 0, 64]
    finally:
        await stack.stop()


async def test_profile_that_cannot_key_adapters_refuses_them():
    stack = await start_stack(
        EngineConfig(engine=SimulatedConfig(lora_modules=(LORA,))),
        spec=make_spec("sglang/sha256@0.5.23", 16),
    )
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stack.generate(**_request(True, None))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "adapter" in info.value.details()
    finally:
        await stack.stop()


async def test_hybrid_spec_simulates_the_first_group_at_its_block_size():
    spec = make_spec("vllm/sha256_cbor@0.31", 16, groups=[32, 16])
    stack = await start_stack(spec=spec)
    try:
        messages = await stack.generate(**_request(False, None, max_tokens=1))
        assert messages[-1].usage.prompt_tokens == 70
        events = GrpcEvents(stack)
        (batch,) = await events.batches(1)
        events.cancel()
        (event,) = ProtobufEventCodec().decode(batch)[1].events
        # Group 0 blocks of 32 tokens are keyed by the chained hash at their last 16-token unit.
        expected = [k.event_key for k in block_keys(PROMPT, spec, KeyContext(group=0))]
        assert event.block_hashes == tuple(expected) and len(expected) == 2
        assert event.block_size == 32 and event.group_idx == 0
    finally:
        await stack.stop()
