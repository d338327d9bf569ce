"""The front door over real loopback servers: ``tokenkeys serve`` engines with their HTTP
frontends behind a router that routes, then forwards the client's request to them."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from ports import free_port
from routing_support import SYSTEM, Cluster, counter, engine_config, start_cluster, wait_until

from tokenkeys.engine.config import LoraModule, SimulatedConfig
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.router.assembly import RouterProcess, RouterProcessConfig
from tokenkeys.router.service import RoutingConfig


@pytest.fixture
async def door(settings):  # noqa: ANN001, ANN201
    cluster = await start_cluster(2, settings=settings, http=True, worker_http=True)
    async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
        yield cluster, client
    await cluster.close()


def worker_url(cluster: Cluster, address: str) -> str:
    return f"http://127.0.0.1:{cluster.stacks[cluster.number(address)].serving.http_port}"


def without_ids(doc: dict) -> dict:
    """An answer without what differs between two calls of the same request: id, time, and
    the cached tokens (the second call finds the first one's blocks)."""
    usage = {k: v for k, v in doc["usage"].items() if k != "prompt_tokens_details"}
    return {**{k: v for k, v in doc.items() if k not in ("id", "created")}, "usage": usage}


async def test_workers_advertise_their_http_frontend(door):
    cluster, _ = door
    for i, stack in enumerate(cluster.stacks):
        ws = cluster.registry.workers[stack.target]
        assert ws.description is not None
        assert ws.description.http_frontend == f"http://127.0.0.1:{stack.serving.http_port}"
        assert cluster.number(stack.target) == i


async def test_a_forwarded_answer_is_the_workers_own(door):
    cluster, client = door
    body = {"prompt": SYSTEM, "max_tokens": 6, "temperature": 0, "seed": 7}
    routed = await client.post("/v1/completions", json=body)
    assert routed.status_code == 200, routed.text
    worker = routed.headers["x-tokenkeys-worker"]
    assert routed.headers["x-tokenkeys-retries"] == "0"
    straight = await client.post(worker_url(cluster, worker) + "/v1/completions", json=body)
    assert without_ids(routed.json()) == without_ids(straight.json())
    assert routed.headers["content-type"] == straight.headers["content-type"]
    names = [k.lower() for k, _ in routed.headers.raw]
    assert len(names) == len(set(names)), "a header the router sets came twice"


async def test_error_bodies_and_statuses_come_back_as_the_worker_sent_them(door):
    cluster, client = door
    # The simulated engine refuses stop strings (501); through the front door the refusal is
    # the worker's, not the router's Generate path's.
    body = {"prompt": "Hi", "max_tokens": 4, "stop": ["."]}
    routed = await client.post("/v1/completions", json=body)
    worker = routed.headers["x-tokenkeys-worker"]
    straight = await client.post(worker_url(cluster, worker) + "/v1/completions", json=body)
    assert routed.status_code == straight.status_code == 501
    assert routed.json() == straight.json()
    assert routed.headers.get("x-should-retry") == straight.headers.get("x-should-retry")


async def test_a_prompt_the_router_cannot_build_is_routed_by_load_and_forwarded(door):
    # truncate_prompt_tokens rewrites the prompt after encoding, which the Preprocessor does
    # not reproduce: the router has no ids for it, so it routes by load and forwards the body;
    # the worker's frontend answers (vLLM serves it; the simulated engine's frontend refuses
    # it, so the answer here is that worker's own 501, passed back as it is).
    cluster, client = door
    for route, body in (
        ("/v1/completions", {"prompt": "Hello there", "truncate_prompt_tokens": 2}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "mm_processor_kwargs": {"x": 1}},
        ),
    ):
        routed = await client.post(route, json={**body, "max_tokens": 2})
        assert routed.headers["x-tokenkeys-reason"] == "load", routed.text
        assert routed.headers["x-tokenkeys-matched-blocks"] == "0/0"
        worker = worker_url(cluster, routed.headers["x-tokenkeys-worker"])
        straight = await client.post(worker + route, json={**body, "max_tokens": 2})
        assert (routed.status_code, routed.json()) == (straight.status_code, straight.json())


async def test_the_promise_is_kept_and_reported_on_a_conversation(door):
    cluster, client = door
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(3):
        messages.append({"role": "user", "content": f"Turn {turn}: when does the Elm train leave?"})
        response = await client.post(
            "/v1/chat/completions", json={"messages": messages, "max_tokens": 6}
        )
        assert response.status_code == 200, response.text
        served = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        expected = int(response.headers["x-tokenkeys-expected-cached-tokens"])
        assert int(response.headers["x-tokenkeys-served-cached-tokens"]) == served
        assert expected == served  # the index and the engine agree, block for block
        if turn:
            assert served > 0
        content = response.json()["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": content})
        await cluster.settle()
    worker = response.headers["x-tokenkeys-worker"]
    assert counter(cluster, "tokenkeys_router_over_promises_total", worker=worker) == 0
    assert counter(cluster, "tokenkeys_router_promise_difference_tokens_count") == 3


async def test_a_stream_is_relayed_event_by_event_with_usage(door):
    cluster, client = door
    body = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", "/v1/chat/completions", json=body) as routed:
        assert routed.status_code == 200
        assert routed.headers["content-type"].startswith("text/event-stream")
        assert "x-tokenkeys-expected-cached-tokens" in routed.headers
        text = (await routed.aread()).decode()
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    assert '"usage"' in events[-2]
    worker = routed.headers["x-tokenkeys-worker"]
    straight = await client.post(worker_url(cluster, worker) + "/v1/chat/completions", json=body)
    assert len([e for e in straight.text.split("\n\n") if e]) == len(events)


async def test_render_is_forwarded_and_tokenize_answered_by_the_router(door):
    cluster, client = door
    body = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 3}
    routed = await client.post("/v1/chat/completions/render", json=body)
    assert routed.status_code == 200, routed.text
    worker = routed.headers["x-tokenkeys-worker"]
    straight = await client.post(
        worker_url(cluster, worker) + "/v1/chat/completions/render", json=body
    )
    assert routed.json()["token_ids"] == straight.json()["token_ids"]
    tokens = await client.post("/tokenize", json={"messages": body["messages"]})
    assert tokens.json()["tokens"] == routed.json()["token_ids"]
    assert "x-tokenkeys-worker" not in tokens.headers


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer off a raw connection: status, headers (the last of each name), body."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in head[1:] if line)
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readexactly(2)
    else:
        body = await reader.readexactly(int(headers["content-length"]))
    return int(head[0].split()[1]), headers, body


async def test_pipelined_requests_chunked_or_not_are_forwarded_in_order(door):
    # A forwarded POST goes through the router's own request cycle
    # (transport/direct_cycle.py), any other request through uvicorn's: pipelined on one
    # connection, they are answered in order, a chunked body forwarded whole.
    cluster, _ = door
    host, port = cluster.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps({"prompt": SYSTEM, "max_tokens": 2, "temperature": 0}).encode()
    head = "POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
    chunked = b"".join(
        b"%x\r\n%b\r\n" % (len(body[i : i + 50]), body[i : i + 50]) for i in range(0, len(body), 50)
    )
    writer.write(
        (head + f"content-length: {len(body)}\r\n\r\n").encode()
        + body
        + b"GET /v1/models HTTP/1.1\r\nhost: t\r\n\r\n"
        + (head + "transfer-encoding: chunked\r\n\r\n").encode()
        + chunked
        + b"0\r\n\r\n"
    )
    try:
        first, models, third = [await _answer(reader) for _ in range(3)]
    finally:
        writer.close()
    for status, headers, answer in (first, third):
        assert status == 200 and headers["x-tokenkeys-retries"] == "0", answer
        assert json.loads(answer)["usage"]["prompt_tokens"] > 0
    assert json.loads(first[2])["choices"] == json.loads(third[2])["choices"]
    assert models[0] == 200 and "x-tokenkeys-worker" not in models[1]
    assert json.loads(models[2])["data"]


async def test_a_worker_refusing_connections_gets_the_next_best(settings):
    cluster = await start_cluster(2, settings=settings, worker_http=True)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    a, b = cluster.addresses
    config = RoutingConfig(
        workers=(f"{a},{dead}", f"{b},{worker_url(cluster, b)}"),
        policy="round_robin",  # every other request is decided for a
        poll_interval=0.2,
        timeout=1.0,
        pools=settings,
    )
    router = await RouterProcess(RouterProcessConfig(config, http_port=0)).start()
    try:
        url = f"http://127.0.0.1:{router.http_port}"
        served, retries = [], 0
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            for i in range(4):
                body = {"prompt": f"{i} {SYSTEM}", "max_tokens": 3}
                response = await client.post("/v1/completions", json=body)
                assert response.status_code == 200, response.text
                served.append(response.headers["x-tokenkeys-worker"])
                retries += int(response.headers["x-tokenkeys-retries"])
        assert served == [b] * 4
        assert retries == 2
        metrics = router.service.metrics.registry
        assert (
            metrics.get_sample_value(
                "tokenkeys_router_requests_total", {"worker": a, "outcome": "retried"}
            )
            == 2
        )
    finally:
        await router.stop()
        await cluster.close()


async def test_a_client_that_disconnects_aborts_the_workers_request(settings):
    slow = SimulatedConfig(
        latency=LatencyModel(decode_s_per_token=0.2, sleep=True)
    )  # 100 s for 500
    configs = [engine_config(engine=slow) for _ in range(2)]
    cluster = await start_cluster(
        2, settings=settings, http=True, worker_http=True, configs=configs
    )
    try:
        body = {"prompt": SYSTEM, "max_tokens": 500, "stream": True, "ignore_eos": True}
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                worker = response.headers["x-tokenkeys-worker"]
                async for _ in response.aiter_bytes():
                    break  # the first event arrived: the worker is generating
        engine = cluster.stacks[cluster.number(worker)].local()

        async def idle() -> bool:
            return (await engine.load()).running == 0

        await wait_until(idle, what="the worker aborting the abandoned request")
        assert (await engine.load()).running == 0
    finally:
        await cluster.close()


async def test_a_client_that_disconnects_from_a_whole_answer_releases_the_worker(settings):
    slow = SimulatedConfig(
        latency=LatencyModel(decode_s_per_token=0.2, sleep=True)
    )  # 100 s for 500
    configs = [engine_config(engine=slow) for _ in range(2)]
    cluster = await start_cluster(
        2, settings=settings, http=True, worker_http=True, configs=configs
    )
    try:
        body = {"prompt": SYSTEM, "max_tokens": 500, "ignore_eos": True}
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            task = asyncio.ensure_future(client.post("/v1/completions", json=body))
            engines = [s.local() for s in cluster.stacks]

            async def busy() -> bool:
                return any([(await e.load()).running for e in engines])

            await wait_until(busy, what="the request reaching a worker")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        # The router let go of the worker's connection (vLLM aborts a request whose
        # connection closes, its ``with_cancellation``; the simulated frontend finishes it).
        pool = cluster.router.pool(None)

        def released() -> bool:
            return all(m.view.inflight == 0 for m in pool.members.values())

        await wait_until(released, what="the router releasing the abandoned request")
    finally:
        await cluster.close()


async def test_a_worker_that_dies_mid_stream_ends_it_as_vllm_reports_an_error(settings):
    slow = SimulatedConfig(latency=LatencyModel(decode_s_per_token=0.05, sleep=True))
    configs = [engine_config(engine=slow) for _ in range(2)]
    cluster = await start_cluster(
        2, settings=settings, http=True, worker_http=True, configs=configs
    )
    try:
        body = {"prompt": SYSTEM, "max_tokens": 500, "stream": True, "ignore_eos": True}
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                worker = response.headers["x-tokenkeys-worker"]
                chunks = response.aiter_bytes()
                received = await anext(chunks)
                await cluster.stop_engine(cluster.number(worker))
                async for chunk in chunks:
                    received += chunk
        events = [e for e in received.decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert error["code"] == 503 and "broke off the stream" in error["message"]
        assert all(json.loads(e.removeprefix("data: ")) for e in events[:-1])  # whole events
    finally:
        await cluster.close()


async def test_anthropic_messages_and_responses_are_routed_on_their_own_prompt(door):
    """The Messages and Responses routes go to a worker chosen with the ids the worker itself
    renders (the router's decision holds the conversation's prefix on its second turn), and come
    back as the worker answered."""
    cluster, client = door
    body = {
        "model": "smollm2-135m-instruct",
        "max_tokens": 4,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "What is the first rule?"}],
    }
    counted = await client.post("/v1/messages/count_tokens", json=body)
    assert counted.status_code == 200, counted.text
    worker = counted.headers["x-tokenkeys-worker"]
    url = worker_url(cluster, worker)
    straight = await client.post(url + "/v1/messages/count_tokens", json=body)
    assert counted.json() == straight.json()
    rendered = await client.post("/v1/messages/render", json=body)
    assert rendered.status_code == 200, rendered.text
    assert len(rendered.json()["token_ids"]) == counted.json()["input_tokens"]
    first = await client.post("/v1/messages", json=body)
    assert first.status_code == 200, first.text
    assert first.json()["type"] == "message"
    holder = first.headers["x-tokenkeys-worker"]
    # The engine's events of the first turn reach the router; the same conversation then
    # goes to the worker that holds it, with the prefix promised.
    await cluster.settle()
    second = await client.post("/v1/messages", json=body)
    assert second.headers["x-tokenkeys-worker"] == holder
    assert int(second.headers["x-tokenkeys-expected-cached-tokens"]) > 0
    responses = {
        "model": "smollm2-135m-instruct",
        "instructions": SYSTEM,
        "input": "What is the first rule?",
    }
    routed = await client.post("/v1/responses/render", json=responses)
    assert routed.status_code == 200, routed.text
    own = await client.post(
        worker_url(cluster, routed.headers["x-tokenkeys-worker"]) + "/v1/responses/render",
        json=responses,
    )
    assert routed.json()["token_ids"] == own.json()["token_ids"]


async def test_a_lora_adapter_is_routed_by_name_on_the_adapters_keys(settings):
    # The workers register the adapter (vLLM --lora-modules ada=PATH); the router learns it
    # from their frontends' /v1/models and keys the request as the engine keys it: ("lora",
    # name, path) enters every block key, so the base model's same prompt matches nothing.
    ada = LoraModule.parse("ada=/adapters/ada-v1", 1)
    configs = [engine_config(engine=SimulatedConfig(lora_modules=(ada,))) for _ in range(2)]
    cluster = await start_cluster(
        2, settings=settings, http=True, worker_http=True, configs=configs
    )
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            cards = (await client.get("/v1/models")).json()["data"]
            base = cards[0]["id"]
            assert {(c["id"], c["root"], c["parent"]) for c in cards if c["parent"]} == {
                ("ada", "/adapters/ada-v1", base)
            }
            body = {"model": "ada", "prompt": f"{SYSTEM} with the adapter", "max_tokens": 3}
            first = await client.post("/v1/completions", json=body)
            assert first.status_code == 200, first.text
            assert first.json()["model"] == "ada"
            await cluster.settle()

            async def matched(model: str) -> int:
                dry = await client.post("/router/route", json={**body, "model": model})
                return dry.json()["matched_blocks"]

            held = await matched("ada")
            assert held > 0 and await matched(base) == 0
            again = await client.post("/v1/completions", json=body)
            assert again.headers["x-tokenkeys-worker"] == first.headers["x-tokenkeys-worker"]
            served = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert int(again.headers["x-tokenkeys-expected-cached-tokens"]) == served > 0
            unknown = await client.post("/v1/completions", json={**body, "model": "bob"})
            assert unknown.status_code == 404, unknown.text
    finally:
        await cluster.close()


async def test_a_lora_adapter_goes_only_to_the_workers_that_serve_it(settings):
    # Worker 0 registers the adapter, worker 1 does not (it would answer 404, as vLLM does for
    # a model it does not serve): every request naming the adapter goes to worker 0, whatever
    # the load and prefixes say; the base model may still go to either.
    ada = LoraModule.parse("ada=/adapters/ada-v1", 1)
    configs = [engine_config(engine=SimulatedConfig(lora_modules=(ada,))), engine_config()]
    cluster = await start_cluster(
        2, settings=settings, http=True, worker_http=True, configs=configs
    )
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as client:
            prompts = [f"{SYSTEM} question {n} " * (n + 1) for n in range(6)]
            served = set()
            for prompt in prompts:
                body = {"model": "ada", "prompt": prompt, "max_tokens": 2}
                dry = (await client.post("/router/route", json=body)).json()
                assert [r["worker"] for r in dry["ranking"]] == [dry["worker"]]
                answer = await client.post("/v1/completions", json=body)
                assert answer.status_code == 200, answer.text
                served.add(cluster.number(answer.headers["x-tokenkeys-worker"]))
                base = await client.post("/router/route", json={**body, "model": None})
                assert len(base.json()["ranking"]) == 2
            assert served == {0}
    finally:
        await cluster.close()
