"""OpenAI Responses on a real loopback server with the simulated engine (issue 34).

The served number: a Responses request renders (``/v1/responses/render``) and generates
(``/v1/responses`` ``usage``) exactly the ids of its chat conversion on /tokenize, over the
systematic corpus (input as a string or items, instructions, tools, previous turns carried in
the input). The whole answer has vLLM 0.32's shape (``ResponsesResponse``: every key, the
request's parameters echoed). Refusals: ``previous_response_id`` as vLLM without a response store
(404), streaming and output logprobs on the simulated engine (501 naming the field).
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic_corpus
import httpx
import pytest

from tokenkeys.preprocess.responses import to_chat_request

from http_support import served_as

NAME = "smollm2"

#: The keys of vLLM 0.32's ``ResponsesResponse`` as it serializes a whole answer (``metrics``
#: is left out unless per-request metrics are enabled on the server).
RESPONSE_KEYS = {
    "id",
    "created_at",
    "incomplete_details",
    "instructions",
    "metadata",
    "model",
    "object",
    "output",
    "parallel_tool_calls",
    "temperature",
    "tool_choice",
    "tools",
    "top_p",
    "background",
    "max_output_tokens",
    "max_tool_calls",
    "previous_response_id",
    "prompt",
    "reasoning",
    "service_tier",
    "status",
    "text",
    "top_logprobs",
    "truncation",
    "usage",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "kv_transfer_params",
    "ec_transfer_params",
    "input_messages",
    "output_messages",
}


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with served_as(NAME) as (c, _models):
        yield c


def _ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def _generated() -> list[tuple[str, dict]]:
    return [
        (label, body)
        for label, body in anthropic_corpus.responses_requests()
        if label not in ("stream", "bare-output-text")
    ]


@pytest.mark.parametrize(("label", "body"), _generated(), ids=lambda v: str(v)[:40])
def test_render_and_usage_are_the_chat_count_of_the_conversion(client, label, body) -> None:
    body = {"model": NAME, **body}
    ids = _ok(client.post("/tokenize", json=to_chat_request(body)))["tokens"]
    assert _ok(client.post("/v1/responses/render", json=body))["token_ids"] == ids
    answer = _ok(client.post("/v1/responses", json={**body, "max_output_tokens": 5}))
    assert set(answer) == RESPONSE_KEYS
    usage = answer["usage"]
    assert usage["input_tokens"] == len(ids)
    assert usage["total_tokens"] == len(ids) + usage["output_tokens"]
    assert answer["object"] == "response" and answer["model"] == NAME
    assert answer["status"] in ("completed", "incomplete")
    assert answer["max_output_tokens"] == 5
    assert answer["instructions"] == body.get("instructions")
    assert answer["tool_choice"] == (
        body.get("tool_choice", "auto") if body.get("tools") else "none"
    )
    for item in answer["output"]:
        assert item["type"] == "message" and item["content"][0]["type"] == "output_text"


def test_the_answer_echoes_the_request_as_vllm(client) -> None:
    body = {
        "model": NAME,
        "input": "Hi",
        "request_id": "resp_mine",
        "max_output_tokens": 3,
        "temperature": 0.5,
        "top_p": 0.9,
        "metadata": {"k": "v"},
        "user": "u1",
        "ignore_eos": True,
    }
    answer = _ok(client.post("/v1/responses", json=body))
    assert answer["id"] == "resp_mine"
    assert (answer["temperature"], answer["top_p"]) == (0.5, 0.9)
    assert (answer["metadata"], answer["user"]) == ({"k": "v"}, "u1")
    # ignore_eos: all three tokens are drawn, the budget ends the answer.
    assert answer["status"] == "incomplete"
    assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
    assert answer["usage"]["output_tokens"] == 3


@pytest.mark.parametrize(
    ("extra", "status", "field"),
    [
        ({"previous_response_id": "resp_1"}, 404, "response_id"),
        ({"stream": True}, 501, "stream"),
        ({"include": ["message.output_text.logprobs"]}, 501, "include"),
        ({"input": [{"type": "bogus"}]}, 400, "input"),
        ({"tools": [{"type": "web_search_preview"}]}, 501, "tools[0]"),
    ],
)
def test_refusals_name_the_field(client, extra: dict, status: int, field: str) -> None:
    answer = client.post("/v1/responses", json={"model": NAME, "input": "Hi", **extra})
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == field


def test_previous_response_id_is_vllms_not_found(client) -> None:
    answer = client.post(
        "/v1/responses", json={"model": NAME, "input": "Hi", "previous_response_id": "resp_x"}
    )
    assert answer.json()["error"]["message"] == "Response with id 'resp_x' not found."


@pytest.mark.parametrize("path", ["/v1/responses/render", "/v1/responses"])
def test_truncation_auto_is_served_within_the_context_and_refused_over_it(client, path) -> None:
    """vLLM 0.32 cuts a prompt over the context under ``truncation: auto``
    (``truncate_prompt_tokens=-1``); within it, auto changes nothing, so it is served as
    disabled is, and over it the answer is a 501 naming the field, never a cut prompt."""
    body = {"model": NAME, "input": "Hi", "max_output_tokens": 3}
    plain = _ok(client.post("/v1/responses/render", json=body))["token_ids"]
    auto = client.post(path, json={**body, "truncation": "auto"})
    assert auto.status_code == 200, auto.text
    if path.endswith("render"):
        assert auto.json()["token_ids"] == plain
    else:
        assert auto.json()["usage"]["input_tokens"] == len(plain)
        assert auto.json()["truncation"] == "auto"
    long = {**body, "input": "Hi there " * 3000}
    refused = client.post(path, json={**long, "truncation": "auto"})
    assert refused.status_code == 501, refused.text
    assert refused.json()["error"]["param"] == "truncation"
    assert client.post(path, json=long).status_code == 400
