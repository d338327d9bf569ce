"""The routing HTTP frontend over three simulated engines: OpenAI routes, headers, metrics."""

from __future__ import annotations

import json

import httpx
import pytest
from routing_support import SYSTEM, start_cluster

from tokenkeys.keys import make_spec
from tokenkeys.limits import Limits
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.router.workers.pool_setup import PoolSettings
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import ModelRegistry, attach_cache_keys
from tokenkeys.tokenizer import TokenizerOptions


@pytest.fixture
async def routed(settings):  # noqa: ANN001, ANN201
    cluster = await start_cluster(3, settings=settings, http=True)
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
        yield cluster, client
    await cluster.close()


async def chat(client: httpx.AsyncClient, messages: list[dict], **extra: object) -> httpx.Response:
    response = await client.post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 8, **extra}
    )
    assert response.status_code == 200, response.text
    return response


async def test_a_conversation_stays_on_its_worker_and_reports_cached_tokens(routed):
    cluster, client = routed
    messages = [{"role": "system", "content": SYSTEM}]
    workers, cached = [], []
    for turn in range(4):
        messages.append({"role": "user", "content": f"Turn {turn}: is the Elm train on time?"})
        response = await chat(client, messages)
        body = response.json()
        workers.append(response.headers["x-tokenkeys-worker"])
        cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert response.headers["x-tokenkeys-policy"] == "precise"
        if turn:
            assert response.headers["x-tokenkeys-reason"] == "prefix"
            matched, total = map(int, response.headers["x-tokenkeys-matched-blocks"].split("/"))
            assert 0 < matched <= total
            assert float(response.headers["x-tokenkeys-score"]) == pytest.approx(
                matched / total, abs=1e-4
            )
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        await cluster.settle()
    assert len(set(workers)) == 1 and workers[0] in cluster.addresses
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])


async def test_tokenize_answers_locally_with_the_engine_tokenization(routed):
    cluster, client = routed
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi!"}]
    response = await client.post("/tokenize", json={"messages": messages})
    assert response.status_code == 200, response.text
    engine_model = cluster.stacks[0].models.get(None)
    expected = engine_model.preprocessor.tokenize_chat({"messages": messages}).tokens.ids
    assert response.json()["tokens"] == expected
    assert "x-tokenkeys-worker" not in response.headers  # nothing was routed
    text = (await client.post("/detokenize", json={"tokens": expected})).json()["prompt"]
    assert text == engine_model.preprocessor.detokenize([expected])[0]
    # the count /tokenize reports is the prompt the worker received
    usage = (await chat(client, messages)).json()["usage"]
    assert usage["prompt_tokens"] == len(expected)


async def test_completions_stream_with_usage_and_headers(routed):
    cluster, client = routed
    prompt = SYSTEM * 2
    for _ in range(2):
        async with client.stream(
            "POST",
            "/v1/completions",
            json={
                "prompt": prompt,
                "max_tokens": 4,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as response:
            assert response.status_code == 200
            worker = response.headers["x-tokenkeys-worker"]
            events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        usage = json.loads(events[-2].removeprefix("data: "))["usage"]
        await cluster.settle()
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert worker in cluster.addresses


async def test_metrics_and_worker_status(routed):
    cluster, client = routed
    await chat(client, [{"role": "user", "content": "hello"}])
    text = (await client.get("/metrics")).text
    assert 'tokenkeys_router_decisions_total{model="smollm2-135m-instruct",policy="precise"' in text
    assert "tokenkeys_router_kv_batches_total" in text
    assert 'tokenkeys_router_workers{model="smollm2-135m-instruct",state="ready"} 3.0' in text
    status = (await client.get("/router/workers")).json()
    assert [p["members"] for p in status["pools"]] == [sorted(cluster.addresses)]
    assert {w["state"] for w in status["workers"]} == {"ready"}
    assert status["pools"][0]["key_strategy"] == "local"  # the vectors passed here
    models = (await client.get("/v1/models")).json()["data"]
    assert [m["id"] for m in models] == ["smollm2-135m-instruct"]


async def test_unknown_model_and_no_ready_worker_get_openai_errors(routed):
    cluster, client = routed
    response = await client.post(
        "/v1/completions", json={"model": "nope", "prompt": "hi", "max_tokens": 1}
    )
    assert response.status_code == 404
    assert "nope" in response.json()["error"]["message"]
    for i in range(3):
        await cluster.stop_engine(i)
    await cluster.registry.poll_once()
    response = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "ServiceUnavailableError"


async def test_a_dry_run_shows_the_decision_without_generating(routed):
    cluster, client = routed
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
    served = (await chat(client, messages)).headers["x-tokenkeys-worker"]
    await cluster.settle()
    before = (await client.get("/metrics")).text.count("tokenkeys_router_decisions_total{")
    decision = (await client.post("/router/route", json={"messages": messages})).json()
    assert decision["worker"] == served and decision["reason"] == "prefix"
    assert decision["ranking"][0]["worker"] == served
    assert [r["worker"] for r in decision["ranking"]][1:] != []
    costs = [r["cost"] for r in decision["ranking"]]
    assert costs == sorted(costs) and costs[0] < costs[-1]  # the cheapest first
    assert 0 < decision["matched_blocks"] <= decision["total_blocks"]
    metrics = (await client.get("/metrics")).text
    assert metrics.count("tokenkeys_router_decisions_total{") == before
    assert 'reason="prefix"' not in metrics  # recorded decisions are only the real one (load)


async def test_chat_is_never_tokenized_differently_when_the_engines_override_the_template(tmp_path):
    """The engines render chat with a server-side template the artifacts do not carry (only
    its digest, in the fingerprint): the router never tokenizes chat differently. Over
    ``Generate`` it answers 501; through the front door (workers with HTTP frontends) the chat
    request is routed by load alone, no prefix claimed, and the worker renders it with its own
    template. Completions route by prefix either way."""

    def overridden() -> ModelRegistry:
        chat = ChatOptions(chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
        models = load_models([ModelSource.default()], TokenizerOptions(), Limits(), chat)
        attach_cache_keys(models, make_spec("vllm/sha256_cbor@0.31", 16), Limits())
        return models

    for forwarded in (False, True):
        cluster = await start_cluster(
            2,
            settings=PoolSettings(cache=tmp_path),
            models=overridden,
            http=True,
            worker_http=forwarded,
        )
        try:
            async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
                messages = [{"role": "user", "content": "hi"}]
                body = {"messages": messages, "max_tokens": 2}
                response = await client.post("/v1/chat/completions", json=body)
                if forwarded:
                    assert response.status_code == 200, response.text
                    assert response.headers["x-tokenkeys-reason"] == "load"
                    assert response.headers["x-tokenkeys-matched-blocks"] == "0/0"
                else:
                    assert response.status_code == 501, response.text
                    assert "--chat-template" in response.json()["error"]["message"]
                body = {"prompt": "hi", "max_tokens": 2}
                response = await client.post("/v1/completions", json=body)
                assert response.status_code == 200
        finally:
            await cluster.close()
