"""Admission into pools with real engines: refusals by reason, and events of a foreign spec."""

from __future__ import annotations

import asyncio

from engine_stack import start_stack
from routing_support import (
    SYSTEM,
    counter,
    engine_config,
    engine_models,
    engine_run,
    index_run,
    prompt_ids,
    start_cluster,
    wait_until,
)

from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.keys import make_spec
from tokenkeys.keys.proto import spec_ref
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions


async def test_workers_that_differ_from_their_pool_are_refused_with_a_reason(settings):
    cluster = await start_cluster(2, settings=settings, transport="zmq")
    odd = []
    try:
        # Another tokenizer behaviour (special tokens on chat prompts) -> another fingerprint.
        other_tokenizer = load_models(
            [ModelSource.default()], TokenizerOptions(add_special_tokens_chat=True), Limits()
        )
        odd.append(await start_stack(engine_config(), models=other_tokenizer))
        # The same tokenizer keyed with 32-token blocks -> another cache-key spec.
        odd.append(await start_stack(engine_config(), models=engine_models(block_size=32)))
        # No KV events over the transport this router follows (ZMQ here).
        odd.append(await start_stack(engine_config(kv_events=False), models=engine_models()))
        registry = cluster.registry
        for stack in odd:
            await registry.add(stack.target)
        pool = next(iter(registry.pools.values()))
        assert sorted(pool.members) == sorted(cluster.addresses)
        reasons = {}
        for stack in odd:
            ws = registry.workers[stack.target]
            assert ws.state == "refused"
            (refusal,) = ws.refusals
            reasons[stack.target] = refusal.reason
            assert stack.target in refusal.message
        assert list(reasons.values()) == ["tokenizer_fingerprint", "key_spec", "no_event_source"]
        refused = "tokenkeys_router_workers_refused_total"
        for reason in reasons.values():
            assert counter(cluster, refused, reason=reason) == 1
        status = registry.status()
        assert [w["refusals"][0]["reason"] for w in status["workers"][2:]] == list(reasons.values())
        # Refused workers are not routed to and are not checked again while unchanged.
        await registry.poll_once()
        for reason in reasons.values():
            assert counter(cluster, refused, reason=reason) == 1
    finally:
        for stack in odd:
            await stack.stop()
        await cluster.close()


async def test_events_of_a_foreign_spec_are_ignored_counted_and_recheck_the_worker(settings):
    cluster = await start_cluster(2, settings=settings, transport="grpc")
    try:
        pool = next(iter(cluster.registry.pools.values()))
        stack = cluster.stacks[0]
        parts = stack.runtime.parts(stack.models.get(None).name)
        own = prompt_ids(cluster, "Own spec. " + SYSTEM)
        await stack.generate(token_ids={"ids": own}, stopping={"max_tokens": 1})
        await cluster.settle()
        assert await index_run(cluster, own, stack.target) == engine_run(cluster, own, 0) > 0

        # The engine's stream starts stamping another spec on its batches (its advertisement
        # is unchanged): those hashes are not indexed, they are counted.
        # (The running stream holds the codec it started with; discovery reads parts.protobuf.)
        streaming = parts.protobuf
        parts.protobuf = ProtobufEventCodec(streaming.int_encoding, streaming.key_spec)
        streaming.key_spec = spec_ref(make_spec("vllm/sha256_cbor@0.31", 32))
        other = prompt_ids(cluster, "Foreign spec. " + SYSTEM)
        await stack.generate(token_ids={"ids": other}, stopping={"max_tokens": 1})
        await cluster.settle()
        ignored = "tokenkeys_router_kv_events_ignored_total"
        assert counter(cluster, ignored, reason="foreign_spec") >= 1
        assert await index_run(cluster, other, stack.target) == 0 < engine_run(cluster, other, 0)
        assert await index_run(cluster, own, stack.target) > 0  # the rest is kept
        events = "tokenkeys_router_worker_events_total"
        await wait_until(lambda: counter(cluster, events, event="foreign_events") == 1)
        await wait_until(lambda: cluster.registry.workers[stack.target].lock.locked() is False)
        assert stack.target in pool.members  # advertisement unchanged: still a member

        # Now the engine is re-keyed for real (its advertisement says so): the recheck that
        # foreign events trigger refuses it and clears its entries.
        parts.engine.spec = make_spec("vllm/sha256_cbor@0.31", 16, root_seed="42")
        await asyncio.sleep(0.15)  # past the recheck throttle (foreign_interval=0.1 here)
        await stack.generate(
            token_ids={"ids": prompt_ids(cluster, "x " * 64)}, stopping={"max_tokens": 1}
        )
        await wait_until(lambda: stack.target not in pool.members, what="refusal")
        refused = "tokenkeys_router_workers_refused_total"
        assert counter(cluster, refused, reason="key_spec") == 1
        assert await index_run(cluster, own, stack.target) == 0
    finally:
        await cluster.close()
