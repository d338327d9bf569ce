"""Explain over real loopback servers: simulated engines with their HTTP frontends behind
``tokenkeys route``; each cause is checked against what the test did to the engines."""

from __future__ import annotations

import json
import logging

import httpx
from engine_stack import start_stack
from routing_support import (
    SYSTEM,
    Cluster,
    counter,
    engine_config,
    engine_run,
    index_run,
    prompt_ids,
    start_cluster,
    wait_until,
)

from tokenkeys.engine.config import LoraModule, SimulatedConfig
from tokenkeys.keys import make_spec
from tokenkeys.keys.deployment import DEFAULT_PROFILE
from tokenkeys.limits import Limits
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import ModelRegistry, attach_cache_keys
from tokenkeys.tokenizer import TokenizerOptions

#: A prompt of several full blocks (16 tokens each), and others like it.
PROMPT = SYSTEM + "Which trains leave Alder before noon on weekdays, and from which platform?"


PROMISED = "tokenkeys_router_promised_cached_tokens_total"
SERVED = "tokenkeys_router_served_cached_tokens_total"
MISSES = "tokenkeys_router_misses_total"


def prompt(n: int) -> str:
    return f"Question {n}: which station comes after Cedar? " + SYSTEM


async def cluster_of(settings, blocks: int = 4096) -> Cluster:  # noqa: ANN001
    """Two engines of ``blocks`` KV blocks each (24: a few prompts overflow them), their HTTP
    frontends, and the router forwarding to them."""
    configs = [engine_config(engine=SimulatedConfig(num_kv_blocks=blocks)) for _ in range(2)]
    return await start_cluster(2, settings=settings, http=True, worker_http=True, configs=configs)


def worker_url(cluster: Cluster, address: str) -> str:
    return f"http://127.0.0.1:{cluster.stacks[cluster.number(address)].serving.http_port}"


async def explain(client: httpx.AsyncClient, text: str, **extra: object) -> dict:
    body = {"prompt": text, "max_tokens": 1, **extra}
    response = await client.post("/router/explain", json={"route": "/v1/completions", "body": body})
    assert response.status_code == 200, response.text
    return response.json()


def part(doc: dict, address: str) -> dict:
    return next(w for w in doc["workers"] if w["worker"] == address)


async def send(client: httpx.AsyncClient, text: str, **extra: object) -> httpx.Response:
    body = {"prompt": text, "max_tokens": 2, "temperature": 0, **extra}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response


async def test_held_elsewhere_never_stored_and_held(settings):
    cluster = await cluster_of(settings)
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            worker = (await send(client, PROMPT)).headers["x-tokenkeys-worker"]
            other = next(a for a in cluster.addresses if a != worker)
            await cluster.settle()
            doc = await explain(client, PROMPT)
            blocks = doc["prompt_blocks"]
            assert blocks >= 4 and doc["block_size"] == 16
            assert part(doc, worker) == {
                "worker": worker,
                "state": "ready",
                "held_blocks": blocks,
                "first_missing_block": None,
                "cause": None,
                "detail": {},
            }
            there = part(doc, other)
            assert (there["held_blocks"], there["first_missing_block"]) == (0, 0)
            assert there["cause"] == "held_elsewhere"
            assert there["detail"] == {"workers": [worker]}
            # The same system prompt with another question: the shared blocks are held, the
            # first block past them was never stored anywhere.
            longer = PROMPT + " And on Sundays, which trains run from Birch to Hazel?" * 3
            doc = await explain(client, longer)
            mine = part(doc, worker)
            # (The boundary of the shared text may tokenize differently: one block less.)
            assert mine["held_blocks"] in (blocks - 1, blocks)
            assert mine["cause"] == "never_stored"
            # Since the worker was last cleared: its run's opening AllBlocksCleared.
            since = mine["detail"]["since"]
            follower = next(iter(cluster.registry.workers[worker].followers.values()))
            # A clear the router made itself (following the worker anew) has no event number.
            assert since["seq"] is None or since["seq"] <= follower.last_seq
            assert since["applied_at"] > 0
    finally:
        await cluster.close()


async def test_an_evicted_prefix_names_the_batch_that_removed_it(settings):
    cluster = await cluster_of(settings, blocks=24)
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            worker = (await send(client, PROMPT)).headers["x-tokenkeys-worker"]
            await cluster.settle()
            follower = next(iter(cluster.registry.workers[worker].followers.values()))
            before = follower.last_seq
            # Overflow the worker's cache, straight to its frontend (the router routes nothing).
            for n in range(6):
                body = {"prompt": prompt(n), "max_tokens": 2}
                answer = await client.post(
                    worker_url(cluster, worker) + "/v1/completions", json=body
                )
                assert answer.status_code == 200
            await cluster.settle()
            doc = await explain(client, PROMPT)
            mine = part(doc, worker)
            assert mine["cause"] == "evicted", mine
            assert mine["held_blocks"] == mine["first_missing_block"] < doc["prompt_blocks"]
            detail = mine["detail"]
            assert detail["tier"] == "gpu"
            assert before < detail["seq"] <= follower.last_seq
            assert detail["engine_ts"] > 0 and detail["applied_at"] > 0
            # Routed now, the miss is counted by its cause as the request was routed (its
            # answer stores the blocks again, which must not hide the eviction).
            chosen = (await send(client, PROMPT)).headers["x-tokenkeys-worker"]
            cause = "evicted" if chosen == worker else "not_held"
            assert counter(cluster, MISSES, worker=chosen, cause=cause) == 1
    finally:
        await cluster.close()


async def test_another_cache_salt_is_named_without_its_value(settings):
    cluster = await cluster_of(settings)
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            salted = await send(client, PROMPT, cache_salt="tenant-a")
            worker = salted.headers["x-tokenkeys-worker"]
            await cluster.settle()
            for asked in ({}, {"cache_salt": "tenant-b"}):
                doc = await explain(client, PROMPT, **asked)
                mine = part(doc, worker)
                assert (mine["held_blocks"], mine["cause"]) == (0, "other_context"), mine
                assert mine["detail"] == {"cache_salt": "another"}
                assert "tenant-a" not in json.dumps(doc)
            # Under its own salt the prompt is held.
            doc = await explain(client, PROMPT, cache_salt="tenant-a")
            assert part(doc, worker)["cause"] is None
    finally:
        await cluster.close()


def other_template() -> ModelRegistry:
    chat = ChatOptions(chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    models = load_models([ModelSource.default()], TokenizerOptions(), Limits(), chat)
    attach_cache_keys(models, make_spec(DEFAULT_PROFILE, 16), Limits())
    return models


async def test_a_worker_with_another_chat_template_renders_differently(settings):
    cluster = await cluster_of(settings)
    odd = await start_stack(engine_config(), models=other_template(), http_port=0)
    try:
        await cluster.registry.add(odd.target)
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            doc = await explain(client, PROMPT)
            mine = part(doc, odd.target)
            assert (mine["state"], mine["cause"]) == ("refused", "renders_differently")
            pool = cluster.router.pool(None)
            assert mine["detail"]["router_fingerprint"] == pool.fingerprint
            assert mine["detail"]["worker_fingerprint"] != pool.fingerprint
    finally:
        await odd.stop()
        await cluster.close()


async def test_a_lost_batch_is_explained_by_the_short_answer_and_counted(settings, caplog):
    cluster = await cluster_of(settings, blocks=24)
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            first = await send(client, PROMPT)
            worker = first.headers["x-tokenkeys-worker"]
            await cluster.settle()
            # A test-only fault: the router's follower of the worker loses every batch from
            # here on without noticing (no gap: the subscriber saw them), so the index keeps
            # the blocks the overflow below evicts.
            follower = next(iter(cluster.registry.workers[worker].followers.values()))
            original = follower.handle

            async def lose(delivery) -> None:  # noqa: ANN001
                follower.last_seq = delivery.seq

            follower.handle = lose
            for n in range(6):
                body = {"prompt": prompt(n), "max_tokens": 2}
                answer = await client.post(
                    worker_url(cluster, worker) + "/v1/completions", json=body
                )
                assert answer.status_code == 200
            await cluster.settle()
            with caplog.at_level(logging.WARNING, "tokenkeys.router.explain.accuracy"):
                response = await client.post(
                    "/v1/completions",
                    json={"prompt": PROMPT, "max_tokens": 2, "temperature": 0},
                    headers={"x-tokenkeys-explain": "1"},
                )
                assert response.status_code == 200
                assert response.headers["x-tokenkeys-worker"] == worker
                expected = int(response.headers["x-tokenkeys-expected-cached-tokens"])
                served = int(response.headers["x-tokenkeys-served-cached-tokens"])
                assert served < expected
                told = json.loads(response.headers["x-tokenkeys-explain"])
                assert told["cause"] == "promised_not_served"
                assert told["first_missing_block"] == served // 16
                assert told["detail"] == {"expected_tokens": expected, "served_tokens": served}
                await cluster.service.accuracy.close()
            logged = [r.getMessage() for r in caplog.records if "over-promise" in r.getMessage()]
            assert len(logged) == 1 and worker in logged[0] and "promised_not_served" in logged[0]
            # Still losing its events: the endpoint says the same, from the short answer.
            doc = await explain(client, PROMPT)
            mine = part(doc, worker)
            assert mine["cause"] == "promised_not_served"
            assert mine["first_missing_block"] == served // 16
            # The accuracy metrics say it, per worker.
            assert counter(cluster, "tokenkeys_router_over_promises_total", worker=worker) == 1
            assert counter(cluster, MISSES, worker=worker, cause="promised_not_served") == 1
            promised = counter(
                cluster, "tokenkeys_router_promised_cached_tokens_total", worker=worker
            )
            got = counter(cluster, "tokenkeys_router_served_cached_tokens_total", worker=worker)
            assert promised - got == expected - served
            # Events again: the worker stores the block anew and the explanation follows.
            follower.handle = original
            await send(client, PROMPT)
            await cluster.settle()
            assert part(await explain(client, PROMPT), worker)["cause"] != "promised_not_served"
    finally:
        await cluster.close()


async def test_explain_refuses_an_unknown_route_and_a_bad_body(settings):
    cluster = await cluster_of(settings)
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            bad = await client.post("/router/explain", json={"route": "/v1/nope", "body": {}})
            assert bad.status_code == 400 and "/v1/completions" in bad.text
            bad = await client.post("/router/explain", json={"body": "text"})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "body"
            chat = {"messages": [{"role": "user", "content": PROMPT}]}
            ok = await client.request("GET", "/router/explain", json={"body": chat})
            assert ok.status_code == 200 and ok.json()["route"] == "/v1/chat/completions"
    finally:
        await cluster.close()


async def test_a_dropped_batch_is_proven_by_short_answers_and_repaired_by_snapshot(settings):
    """A test-only fault drops the batches that evicted two prompts; routed again, each is
    promised and served short, the engine stores it anew with no removal seen: two proofs, the
    worker is resynchronised from its snapshot, and promises hold again."""
    cluster = await cluster_of(settings, blocks=24)
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            worker = (await send(client, PROMPT)).headers["x-tokenkeys-worker"]
            other_prompt = "Another opening entirely, then: " + SYSTEM
            direct = worker_url(cluster, worker) + "/v1/completions"
            answer = await client.post(direct, json={"prompt": other_prompt, "max_tokens": 2})
            assert answer.status_code == 200
            await cluster.settle()
            ids = [prompt_ids(cluster, PROMPT), prompt_ids(cluster, other_prompt)]
            for prompt_of in ids:
                assert await index_run(cluster, prompt_of, worker) == engine_run(
                    cluster, prompt_of, cluster.number(worker)
                )
            # The fault: the router's follower drops every batch while the cache overflows
            # (the subscriber saw them: no gap, nothing replayed). The consumer looks its
            # handler up before it waits, so the fault stays in place and is switched off.
            follower = next(iter(cluster.registry.workers[worker].followers.values()))
            original = follower.handle
            dropping = True

            async def drop(delivery) -> None:  # noqa: ANN001
                if not dropping:
                    return await original(delivery)
                follower.last_seq = delivery.seq

            follower.handle = drop
            for n in range(6):
                answer = await client.post(direct, json={"prompt": prompt(n), "max_tokens": 2})
                assert answer.status_code == 200
            await cluster.settle()  # every batch of the overflow reached the fault
            dropping = False
            number = cluster.number(worker)
            for p in ids:  # the index is stale: it still claims the evicted blocks
                assert engine_run(cluster, p, number) < await index_run(cluster, p, worker)
            for text in (PROMPT, other_prompt):
                response = await send(client, text)
                assert response.headers["x-tokenkeys-worker"] == worker
                expected = int(response.headers["x-tokenkeys-expected-cached-tokens"])
                assert int(response.headers["x-tokenkeys-served-cached-tokens"]) < expected
            resyncs = "tokenkeys_router_worker_resyncs_total"
            await wait_until(
                lambda: counter(cluster, resyncs, reason="stale_answers", source="snapshot") == 1,
                what="the repair of the stale worker",
            )
            short = "tokenkeys_router_short_answers_total"
            assert counter(cluster, short, worker=worker, verdict="stale") == 2
            assert counter(cluster, short, verdict="explained") == 0
            await cluster.settle()
            for text in [PROMPT, other_prompt, *(prompt(n) for n in range(6))]:
                p = prompt_ids(cluster, text)
                assert await index_run(cluster, p, worker) == engine_run(cluster, p, number)
            # Promises hold again: every answer serves exactly what was promised.
            for text in (PROMPT, prompt(5), other_prompt, prompt(4)):
                response = await send(client, text)
                served = response.headers["x-tokenkeys-served-cached-tokens"]
                assert served == response.headers["x-tokenkeys-expected-cached-tokens"]
                await cluster.settle()
            assert counter(cluster, resyncs, reason="stale_answers") == 1
    finally:
        await cluster.close()


async def test_another_adapter_is_named(settings):
    # Both workers register two LoRA adapters (vLLM --lora-modules NAME=PATH); the engine keys
    # an adapter's blocks with ("lora", name, path), so a prompt cached under one adapter is
    # not cached for the base model nor for the other adapter.
    modules = tuple(LoraModule.parse(m, i + 1) for i, m in enumerate(("ada=/a/ada", "bea=/a/bea")))
    configs = [engine_config(engine=SimulatedConfig(lora_modules=modules)) for _ in range(2)]
    cluster = await start_cluster(
        2, settings=settings, http=True, worker_http=True, configs=configs
    )
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            base = (await client.get("/v1/models")).json()["data"][0]["id"]
            worker = (await send(client, PROMPT, model="ada")).headers["x-tokenkeys-worker"]
            await cluster.settle()
            assert part(await explain(client, PROMPT, model="ada"), worker)["cause"] is None
            for model in (base, "bea"):
                mine = part(await explain(client, PROMPT, model=model), worker)
                assert (mine["held_blocks"], mine["cause"]) == (0, "other_context"), mine
                assert mine["detail"] == {"adapter": "ada"}
            # What the engine did: it serves the prompt from its cache for "ada" only.
            async with httpx.AsyncClient(base_url=worker_url(cluster, worker)) as direct:
                for model, cached in (("bea", 0), (base, 0), ("ada", 1)):
                    usage = (await send(direct, PROMPT, model=model)).json()["usage"]
                    got = usage["prompt_tokens_details"]["cached_tokens"]
                    assert (got > 0) == bool(cached), (model, got)
            # The other way round: a prompt held for the base model, asked with an adapter.
            other = prompt(1)
            holder = (await send(client, other, model=base)).headers["x-tokenkeys-worker"]
            await cluster.settle()
            mine = part(await explain(client, other, model="bea"), holder)
            assert (mine["cause"], mine["detail"]) == ("other_context", {"adapter": None})
    finally:
        await cluster.close()
