"""Every configurable limit over a real HTTP server: a request at the limit passes, one past it
is refused with the documented status (413, 429) and a message naming the limit."""

from __future__ import annotations

import dataclasses
import threading

import httpx

from tokenkeys.engine.simulated.engine import SimulatedEngine
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.frontend import HttpConfig
from tokenkeys.keys import block_keys, make_spec
from tokenkeys.limits import Limits

from http_support import HttpServerThread, registry

_SLOW = LatencyModel(decode_s_per_token=0.05, sleep=True)


def _body(limit: int) -> bytes:
    """A /tokenize body of exactly ``limit`` bytes."""
    head, tail = b'{"prompt": "', b'"}'
    return head + b"a" * (limit - len(head) - len(tail)) + tail


def test_http_body_size() -> None:
    limits = Limits(max_request_bytes=1000)
    with HttpServerThread(registry(limits=limits), HttpConfig(limits=limits)) as server:
        headers = {"content-type": "application/json"}
        with httpx.Client(base_url=server.url) as client:
            assert client.post("/tokenize", content=_body(1000), headers=headers).status_code == 200
            refused = client.post("/tokenize", content=_body(1001), headers=headers)
            assert refused.status_code == 413
            assert "max_request_bytes" in refused.json()["error"]["message"]


def test_http_prompts_and_messages() -> None:
    limits = Limits(max_texts_per_request=2, max_messages_per_conversation=3)
    with HttpServerThread(registry(limits=limits), HttpConfig(limits=limits)) as server:
        with httpx.Client(base_url=server.url) as client:
            ok = client.post("/v1/completions", json={"prompt": ["a", "b"], "max_tokens": 1})
            assert ok.status_code == 200, ok.text
            past = client.post("/v1/completions", json={"prompt": ["a", "b", "c"], "max_tokens": 1})
            assert past.status_code == 413 and "max_texts_per_request" in past.text
            turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
            messages = [*turns, {"role": "user", "content": "and?"}]
            assert client.post("/tokenize", json={"messages": messages}).status_code == 200
            past = client.post("/tokenize", json={"messages": [*messages, *turns[:1]]})
            assert past.status_code == 413
            assert "4 messages" in past.text and "max_messages_per_conversation" in past.text
            chat = client.post("/v1/chat/completions", json={"messages": messages * 2})
            assert chat.status_code == 413


def _slow_models(limits: Limits):
    models = registry(limits=limits, engines=False)
    spec = make_spec("vllm/sha256_cbor@0.31", 16)
    for model in models:
        engine = SimulatedEngine(
            key_fn=lambda tokens, ctx: block_keys(tokens, spec, ctx),
            block_size=16,
            num_blocks=1024,
            latency=_SLOW,
        )
        models.replace(dataclasses.replace(model, engine=engine))
    return models


def test_http_streams_per_client() -> None:
    limits = Limits(max_streams_per_client=2)
    body = {"prompt": "hello", "max_tokens": 200, "stream": True, "ignore_eos": True}
    with HttpServerThread(_slow_models(limits), HttpConfig(limits=limits)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            opened = []
            for _ in range(2):
                stream = client.stream("POST", "/v1/completions", json=body)
                response = stream.__enter__()
                assert response.status_code == 200
                lines = response.iter_lines()  # kept: dropping it would close the response
                next(lines)
                opened.append((stream, lines))
            with httpx.Client(base_url=server.url) as other:
                refused = other.post("/v1/completions", json={**body, "max_tokens": 1})
                assert refused.status_code == 429, refused.text
                error = refused.json()["error"]
                assert error["type"] == "RateLimitError"
                assert "max_streams_per_client" in error["message"]
                # The client is the connection's peer: X-Forwarded-For names nobody else.
                spoofed = other.post(
                    "/v1/completions",
                    json={**body, "max_tokens": 1},
                    headers={"x-forwarded-for": "10.1.2.3"},
                )
                assert spoofed.status_code == 429, spoofed.text
                # /tokenize is no stream: still served.
                assert other.post("/tokenize", json={"prompt": "x"}).status_code == 200
            for stream, _ in opened:
                stream.__exit__(None, None, None)
            for _ in range(200):
                status = client.post("/v1/completions", json={**body, "max_tokens": 1}).status_code
                if status == 200:
                    break
                assert status == 429
                threading.Event().wait(0.02)
            assert status == 200
