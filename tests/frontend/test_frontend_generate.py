"""/v1/completions and /v1/chat/completions on a real server with the simulated engine.

OpenAI shapes (whole and streamed, usage with cached tokens), prompts as text or token ids,
the cache salt, and the 501s of what generation does not honour.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import httpx
import orjson
import pytest

from tokenkeys.frontend.responses import (
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
)
from tokenkeys.server.runtime.loading import ModelSource
from tokenkeys.tokenizer import default_tokenizer_path

from http_support import HttpServerThread, attach_engines, registry

LONG = "The router must tokenize every request before it picks a worker. " * 6
USER = [{"role": "user", "content": "Bonjour! 東京 🎌"}]
TOOLS = [{"type": "function", "function": {"name": "f"}}]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    models = registry(
        ModelSource("smollm2", default_tokenizer_path()),
        ModelSource("tokenizer-only", default_tokenizer_path()),
        engines=False,
    )
    attach_engines(models, max_model_len=2048)
    models.replace(dataclasses.replace(models.get("tokenizer-only"), engine=None))
    with HttpServerThread(models) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def _ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def _events(client: httpx.Client, path: str, body: dict) -> list:
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    frames = [f for f in raw.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    assert frames[-1] == "data: [DONE]"
    return [orjson.loads(f[6:]) for f in frames[:-1]]


def _count(client: httpx.Client, body: dict) -> int:
    return _ok(client.post("/tokenize", json=body))["count"]


# --- completions ---


def test_completion_shape_and_usage(client) -> None:
    body = {"model": "smollm2", "prompt": "Hello world", "max_tokens": 5, "seed": 1}
    answer = _ok(client.post("/v1/completions", json={**body, "return_token_ids": True}))
    CompletionResponse.model_validate(answer)
    assert answer["object"] == "text_completion" and answer["id"].startswith("cmpl-")
    (choice,) = answer["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] in ("length", "stop")
    detok = _ok(client.post("/detokenize", json={"tokens": choice["token_ids"]}))["prompt"]
    # seed 1 draws the special token <filename>: skipped by default, as in vLLM.
    assert "<filename>" in detok and choice["text"] == detok.replace("<filename>", "")
    kept = {**body, "skip_special_tokens": False}
    assert _ok(client.post("/v1/completions", json=kept))["choices"][0]["text"] == detok
    usage = answer["usage"]
    assert usage["prompt_tokens"] == _count(client, {"prompt": "Hello world"})
    assert usage["completion_tokens"] == len(choice["token_ids"]) <= 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


def test_several_text_prompts_answer_one_choice_each(client) -> None:
    prompts = ["one prompt", "another, longer prompt"]
    answer = _ok(client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 2}))
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    counted = sum(_count(client, {"prompt": p}) for p in prompts)
    assert answer["usage"]["prompt_tokens"] == counted


@pytest.mark.parametrize("prompt", [[6004, 905, 28], [[6004, 905], [28]]])
def test_token_id_prompts_pass_through_unchanged(client, prompt) -> None:
    body = {"prompt": prompt, "max_tokens": 1, "return_token_ids": True}
    answer = _ok(client.post("/v1/completions", json=body))
    expected = prompt if isinstance(prompt[0], list) else [prompt]
    assert [c["prompt_token_ids"] for c in answer["choices"]] == expected


@pytest.mark.parametrize(
    "prompt,param", [([1, 49152], "prompt"), ([True, 2], "prompt"), ([], "prompt"), ("", None)]
)
def test_bad_prompts_are_400(client, prompt, param) -> None:
    response = client.post("/v1/completions", json={"prompt": prompt})
    assert response.status_code == 400, response.text
    error = ErrorResponse.model_validate(response.json()).error
    assert param is None or error.param == param


def test_a_repeated_prompt_is_served_from_the_prefix_cache(client) -> None:
    body = {"model": "smollm2", "prompt": LONG + "cache me", "max_tokens": 1}
    first = _ok(client.post("/v1/completions", json=body))["usage"]
    second = _ok(client.post("/v1/completions", json=body))["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 16 == 0 and cached < second["prompt_tokens"]


def test_the_cache_salt_separates_cache_entries(client) -> None:
    body = {"prompt": LONG + "salted", "max_tokens": 1}
    _ok(client.post("/v1/completions", json=body))
    salted = {**body, "cache_salt": "tenant-a"}
    first = _ok(client.post("/v1/completions", json=salted))["usage"]
    second = _ok(client.post("/v1/completions", json=salted))["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] > 0
    bad = client.post("/v1/completions", json={**body, "cache_salt": "a/b"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"


def test_stop_token_ids_are_honoured(client) -> None:
    body = {"prompt": "x", "max_tokens": 8, "stop_token_ids": list(range(1000))}
    answer = _ok(client.post("/v1/completions", json=body))
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == 1


def test_over_max_model_len_is_400_even_when_streaming(client) -> None:
    for stream in (False, True):
        body = {"prompt": "x", "max_tokens": 2049, "stream": stream}
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "max_tokens"
        assert "max_model_len=2048" in response.json()["error"]["message"]


def test_max_tokens_is_fitted_to_the_room_the_prompt_leaves(client) -> None:
    # vLLM 0.32 get_max_tokens: prompt + max_tokens past max_model_len generates what fits.
    prompt = [5] * 2040
    answer = _ok(client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2048}))
    assert answer["usage"]["completion_tokens"] == 8
    full = client.post("/v1/completions", json={"prompt": [5] * 2048, "max_tokens": 1})
    assert full.status_code == 400
    assert full.json()["error"]["message"].startswith("max_tokens must be at least 1, got 0.")


# --- chat ---


def test_chat_shape_and_usage(client) -> None:
    body = {"model": "smollm2", "messages": USER, "max_tokens": 4}
    answer = _ok(client.post("/v1/chat/completions", json=body))
    ChatCompletionResponse.model_validate(answer)
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    message = answer["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    assert answer["usage"]["prompt_tokens"] == _count(client, {"messages": USER})


def test_max_completion_tokens_wins_over_max_tokens(client) -> None:
    body = {"messages": USER, "max_tokens": 9, "max_completion_tokens": 2, "ignore_eos": True}
    assert _ok(client.post("/v1/chat/completions", json=body))["usage"]["completion_tokens"] == 2


# --- streams ---


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_stream_carries_the_same_text_and_usage(client, route) -> None:
    body = {"max_tokens": 12, "seed": 7, "ignore_eos": True}
    body |= {"prompt": LONG} if route == "/v1/completions" else {"messages": USER}
    whole = _ok(client.post(route, json=body))
    chunks = _events(
        client, route, {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    *content, last = chunks
    assert (
        last["choices"] == [] and last["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    )
    assert last["usage"]["completion_tokens"] == 12
    assert all(c["usage"] is None for c in content)
    if route == "/v1/completions":
        assert {c["object"] for c in chunks} == {"text_completion"}
        text = "".join(c["choices"][0]["text"] for c in content)
        assert text == whole["choices"][0]["text"]
    else:
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert content[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in content)
        assert text == whole["choices"][0]["message"]["content"]
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert len({c["id"] for c in chunks}) == 1


def test_a_stream_without_include_usage_has_no_usage(client) -> None:
    chunks = _events(client, "/v1/completions", {"prompt": "hi", "max_tokens": 3, "stream": True})
    assert chunks and all("usage" not in c for c in chunks)


def test_a_multi_prompt_stream_indexes_its_choices(client) -> None:
    body = {"prompt": ["a", "b"], "max_tokens": 2, "stream": True, "ignore_eos": True}
    chunks = _events(client, "/v1/completions", body)
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1}


# --- what generation does not honour ---


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"stop": ["\n"]}, "stop"),
        ({"stop": "END"}, "stop"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice",
        ),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs"),
        ({"logit_bias": {"12": 5}}, "logit_bias"),
        ({"min_tokens": 3}, "min_tokens"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, None),
        ({"mm_processor_kwargs": {"x": 1}}, None),
    ],
)
def test_chat_options_generation_cannot_honour_are_501(client, extra, param) -> None:
    response = client.post("/v1/chat/completions", json={"messages": USER, **extra})
    assert response.status_code == 501, response.text
    error = response.json()["error"]
    assert error["type"] == "NotImplementedError" and "not supported" in error["message"]
    assert param is None or error["param"] == param


@pytest.mark.parametrize("extra", [{"echo": True}, {"logprobs": 0}, {"truncate_prompt_tokens": 3}])
def test_completion_options_generation_cannot_honour_are_501(client, extra) -> None:
    response = client.post("/v1/completions", json={"prompt": "hi", **extra})
    assert response.status_code == 501, response.text


@pytest.mark.parametrize(
    "extra",
    [
        {"stop": []},
        {"stop": None},
        {"tool_choice": "auto", "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"tool_choice": "none"},
        {"response_format": {"type": "text"}},
        {"n": 1, "temperature": 0.2, "top_p": 0.9, "top_k": 5, "presence_penalty": 0.1},
        {"user": "u", "logprobs": False},
    ],
)
def test_options_that_change_nothing_counted_are_accepted(client, extra) -> None:
    _ok(client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1, **extra}))


def test_a_model_without_engine_only_counts(client) -> None:
    for route, body in (
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/chat/completions", {"messages": USER}),
    ):
        response = client.post(route, json={"model": "tokenizer-only", **body})
        assert response.status_code == 501 and "no engine" in response.json()["error"]["message"]
    assert _count(client, {"model": "tokenizer-only", "prompt": "hi"}) == 1


# --- models and metrics ---


def test_models_lists_every_served_model(client) -> None:
    answer = _ok(client.get("/v1/models"))
    assert answer["object"] == "list"
    assert [m["id"] for m in answer["data"]] == ["smollm2", "tokenizer-only"]
    assert answer["data"][0]["max_model_len"] == 2048  # the engine's
    assert answer["data"][1]["max_model_len"] == 8192  # the tokenizer's


def test_version_without_a_fronted_vllm_is_tokenkeys_own(client) -> None:
    from tokenkeys import __version__

    assert _ok(client.get("/version")) == {"version": __version__, "tokenkeys_version": __version__}


def test_metrics_count_requests_and_tokens(client) -> None:
    _ok(client.post("/v1/completions", json={"prompt": LONG, "max_tokens": 2}))
    assert client.get("/health").status_code == 200
    text = client.get("/metrics").text
    assert 'tokenkeys_http_requests_total{route="/v1/completions",status="200"}' in text
    assert 'tokenkeys_prompt_tokens_total{model="smollm2",route="completions"}' in text
    assert 'tokenkeys_generation_tokens_total{model="smollm2"}' in text
    assert "tokenkeys_http_request_duration_seconds_bucket" in text
