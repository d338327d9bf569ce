"""The render routes on a real tokenizer-only server: the one Preprocessor's ids, vLLM's shapes.

The answers are compared with a real ``vllm launch render`` in
``tests/realengine/test_vllm_render.py``; here, without vLLM: the ids are /tokenize's (the same
Preprocessor call), the shapes and defaults are those recorded from vLLM 0.32 on that suite's
corpus, and what is not served exactly is refused with 501 and its reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tokenkeys.engine.tokenizer_only import TokenizerOnlyEngine
from tokenkeys.serving.models import attach_tokenizer_only

from http_support import HttpServerThread, registry

USER = [{"role": "user", "content": "Bonjour! 東京 🎌"}]
CONTEXT = 4096


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    models = registry(engines=False)
    attach_tokenizer_only(models, CONTEXT)
    with HttpServerThread(models) as server, httpx.Client(base_url=server.url) as c:
        yield c


def test_the_engine_kind_none_is_an_engine_that_refuses_generation() -> None:
    from tokenkeys.engine.protocol import Engine

    assert isinstance(TokenizerOnlyEngine("m", 8), Engine)


def test_completion_render_ids_are_the_preprocessors(client: httpx.Client) -> None:
    prompts = ["Hello world", "東京 🎌 and more", "x"]
    answer = client.post("/v1/completions/render", json={"prompt": prompts})
    assert answer.status_code == 200, answer.text
    rendered = answer.json()
    for prompt, item in zip(prompts, rendered, strict=True):
        tokens = client.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
        assert item["token_ids"] == tokens
    ids = [item["request_id"] for item in rendered]
    base = ids[0].removesuffix("-0")
    assert base.startswith("cmpl-") and ids == [f"{base}-{i}" for i in range(3)]


def test_chat_render_ids_are_the_preprocessors(client: httpx.Client) -> None:
    body = {"messages": USER, "add_generation_prompt": True}
    answer = client.post("/v1/chat/completions/render", json=body).json()
    assert answer["token_ids"] == client.post("/tokenize", json=body).json()["tokens"]
    assert answer["request_id"].startswith("chatcmpl-")


def test_a_completion_render_has_vllms_defaults(client: httpx.Client) -> None:
    (item,) = client.post("/v1/completions/render", json={"prompt": "Hello"}).json()
    # vLLM 0.32 (recorded): max_tokens 16 is its struct default, so it is omitted.
    assert item["sampling_params"] == {
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "min_p": 0.0,
        "stop": [],
        "stop_token_ids": [],
        "output_kind": 2,
        "skip_clone": True,
        "bad_words": [],
        "skip_reading_prefix_cache": False,
    }
    assert (item["model"], item["output_mode"], item["priority"]) == (None, "tokens", 0)


def test_a_chat_render_budget_is_the_context_left(client: httpx.Client) -> None:
    answer = client.post("/v1/chat/completions/render", json={"messages": USER}).json()
    assert answer["sampling_params"]["max_tokens"] == CONTEXT - len(answer["token_ids"])
    capped = {"messages": USER, "max_completion_tokens": 9, "max_tokens": 20}
    assert (
        client.post("/v1/chat/completions/render", json=capped).json()["sampling_params"][
            "max_tokens"
        ]
        == 9
    )


def test_greedy_sampling_resets_and_omits_what_vllm_resets(client: httpx.Client) -> None:
    body = {"messages": USER, "temperature": 0, "top_k": 5, "top_p": 0.5, "min_p": 0.2}
    params = client.post("/v1/chat/completions/render", json=body).json()["sampling_params"]
    assert params["temperature"] == 0.0
    assert not {"top_p", "top_k", "min_p"} & set(params)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"temperature": 3}, "temperature must be in [0, 2], got 3.0."),
        ({"n": 0}, "n must be at least 1, got 0."),
        ({"temperature": 0, "n": 2}, "n must be 1 when using greedy sampling, got 2."),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, '"auto" tool choice'),
        ({"use_beam_search": True}, "Beam search is not supported by the render endpoint"),
        ({"cache_salt": ""}, "Parameter 'cache_salt' must be a non-empty string"),
    ],
)
def test_refusals_in_vllms_words(client: httpx.Client, body: dict, message: str) -> None:
    answer = client.post("/v1/chat/completions/render", json={"messages": USER, **body})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith(message)


def test_an_unknown_model_is_refused_as_vllm_refuses_it(client: httpx.Client) -> None:
    answer = client.post("/v1/completions/render", json={"model": "nope", "prompt": "x"})
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["message"].startswith("The model `nope` does not exist. Valid aliases: ")
    assert error["param"] == "model"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"json": {}}}, "structured_outputs"),
        ({"return_token_offsets": True}, "return_token_offsets"),
        ({"truncate_prompt_tokens": 3}, None),
    ],
)
def test_what_is_not_rebuilt_exactly_is_501(client: httpx.Client, body: dict, field) -> None:
    answer = client.post("/v1/chat/completions/render", json={"messages": USER, **body})
    assert answer.status_code == 501, answer.text
    assert answer.json()["error"]["param"] == field


def test_an_image_for_a_text_only_model_is_vllms_400(client: httpx.Client) -> None:
    image = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}
    body = {"messages": [{"role": "user", "content": [image]}]}
    answer = client.post("/v1/chat/completions/render", json=body)
    assert answer.status_code == 400, answer.text
    assert "is not a multimodal model" in answer.json()["error"]["message"]


def test_generation_is_refused_with_the_reason(client: httpx.Client) -> None:
    for path, body in (
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/chat/completions", {"messages": USER, "stream": True}),
    ):
        answer = client.post(path, json=body)
        assert answer.status_code == 501
        assert "tokenizer-only (--engine none)" in answer.json()["error"]["message"]
