"""vLLM 0.32's own derender tests (``tests/entrypoints/scale_out/derender/test_derender.py``),
ported with their assertions unchanged, run against any server by ``run(name, client, model)``.

Each case keeps vLLM's requests and assertions; only its harness changes (a synchronous
``httpx.Client`` on the server under test, the served model's name for ``MODEL_NAME``). The
suite runs them against ``tokenkeys serve`` (tests/frontend/test_frontend_derender.py) and
against both ``vllm launch render`` and tokenkeys in tests/realengine/test_vllm_render.py, so a
case that does not hold for vLLM 0.32 itself would show there.

Left out, and why: the logprobs cases of the stored version (they send ``token: "token_id:N"``
placeholders, a later protocol than 0.32's ``token_id`` entries: vLLM 0.32 refuses them; output
logprobs are compared with vLLM's instead in test_vllm_render.py), the metrics case (derendering
metrics is refused here, 501 naming the field), the leading-space cases (they assume a
SentencePiece tokenizer; the suite's models are byte-level) and the parser cases (no parser is
configured on either server).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

CASES: dict[str, Callable[[httpx.Client, str], None]] = {}


def case(fn: Callable[[httpx.Client, str], None]) -> Callable[[httpx.Client, str], None]:
    CASES[fn.__name__] = fn
    return fn


def _render_chat(client: httpx.Client, model: str) -> dict:
    resp = client.post(
        "/v1/chat/completions/render",
        json={"model": model, "messages": [{"role": "user", "content": "Hello"}]},
    )
    assert resp.status_code == 200
    return resp.json()


def _make_generate_response(
    token_ids: list[int] | None,
    request_id: str = "chatcmpl-test-id",
    finish_reason: str = "stop",
    prompt_logprobs: list | None = None,
    kv_transfer_params: dict | None = None,
) -> dict:
    choice: dict = {"index": 0, "token_ids": token_ids, "finish_reason": finish_reason}
    return {
        "request_id": request_id,
        "choices": [choice],
        "prompt_logprobs": prompt_logprobs,
        "kv_transfer_params": kv_transfer_params,
    }


def _render_completion(client: httpx.Client, model: str, prompt: str) -> dict:
    resp = client.post("/v1/completions/render", json={"model": model, "prompt": prompt})
    assert resp.status_code == 200
    data = resp.json()
    assert isinstance(data, list) and len(data) >= 1
    return data[0]


def _make_completion_generate_response(
    token_ids: list[int], request_id: str, kv_transfer_params: dict | None = None
) -> dict:
    return {
        "request_id": request_id,
        "choices": [{"index": 0, "token_ids": token_ids, "finish_reason": "stop"}],
        "prompt_logprobs": None,
        "kv_transfer_params": kv_transfer_params,
    }


def _chat(client: httpx.Client, body: dict) -> httpx.Response:
    return client.post("/v1/chat/completions/derender", json=body)


@case
def test_derender_chat_roundtrip(client: httpx.Client, model: str) -> None:
    gen_req = _render_chat(client, model)
    synthetic_ids = gen_req["token_ids"][:5]
    response = _chat(
        client, {"model": model, "generate_response": _make_generate_response(synthetic_ids)}
    )
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "chat.completion"
    assert len(data["choices"]) == 1
    assert data["choices"][0]["message"]["content"]
    assert data["choices"][0]["message"]["role"] == "assistant"


@case
def test_derender_chat_usage(client: httpx.Client, model: str) -> None:
    synthetic_ids = _render_chat(client, model)["token_ids"][:3]
    response = _chat(
        client,
        {
            "model": model,
            "generate_response": _make_generate_response(synthetic_ids),
            "prompt_tokens": 10,
        },
    )
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == 10
    assert usage["completion_tokens"] == len(synthetic_ids)
    assert usage["total_tokens"] == 10 + len(synthetic_ids)


@case
def test_derender_chat_usage_default(client: httpx.Client, model: str) -> None:
    synthetic_ids = _render_chat(client, model)["token_ids"][:3]
    response = _chat(
        client, {"model": model, "generate_response": _make_generate_response(synthetic_ids)}
    )
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == 0


@case
def test_derender_chat_prompt_logprobs_passthrough(client: httpx.Client, model: str) -> None:
    synthetic_ids = _render_chat(client, model)["token_ids"][:3]
    prompt_logprobs = [None, None]
    response = _chat(
        client,
        {
            "model": model,
            "generate_response": _make_generate_response(
                synthetic_ids, prompt_logprobs=prompt_logprobs
            ),
        },
    )
    assert response.status_code == 200
    assert response.json()["prompt_logprobs"] == prompt_logprobs


@case
def test_derender_chat_kv_transfer_params_passthrough(client: httpx.Client, model: str) -> None:
    synthetic_ids = _render_chat(client, model)["token_ids"][:3]
    kv = {"key": "value"}
    response = _chat(
        client,
        {
            "model": model,
            "generate_response": _make_generate_response(synthetic_ids, kv_transfer_params=kv),
        },
    )
    assert response.status_code == 200
    assert response.json()["kv_transfer_params"] == kv


@case
def test_derender_chat_empty_token_ids(client: httpx.Client, model: str) -> None:
    response = _chat(client, {"model": model, "generate_response": _make_generate_response([])})
    assert response.status_code == 400


@case
def test_derender_chat_null_token_ids(client: httpx.Client, model: str) -> None:
    response = _chat(client, {"model": model, "generate_response": _make_generate_response(None)})
    assert response.status_code == 400


@case
def test_derender_chat_unknown_model(client: httpx.Client, model: str) -> None:
    synthetic_ids = _render_chat(client, model)["token_ids"][:3]
    response = _chat(
        client,
        {"model": "does-not-exist", "generate_response": _make_generate_response(synthetic_ids)},
    )
    assert response.status_code == 404


@case
def test_derender_chat_model_omitted_resolves_served_name(client: httpx.Client, model: str) -> None:
    synthetic_ids = _render_chat(client, model)["token_ids"][:3]
    response = _chat(client, {"generate_response": _make_generate_response(synthetic_ids)})
    assert response.status_code == 200
    assert response.json()["model"] == model


@case
def test_derender_chat_oversized_prompt_token_ids_rejected(
    client: httpx.Client, model: str
) -> None:
    synthetic_ids = _render_chat(client, model)["token_ids"][:3]
    response = _chat(
        client,
        {
            "model": model,
            "generate_response": _make_generate_response(synthetic_ids),
            "prompt_token_ids": [42] * 1_000_000,
        },
    )
    assert response.status_code == 400
    assert "max_model_len" in response.json()["error"]["message"]


@case
def test_derender_completion_roundtrip(client: httpx.Client, model: str) -> None:
    gr1 = _render_completion(client, model, "Hello world")
    gr2 = _render_completion(client, model, "Goodbye world")
    ids1, ids2 = gr1["token_ids"][:4], gr2["token_ids"][:4]
    response = client.post(
        "/v1/completions/derender",
        json={
            "model": model,
            "generate_responses": [
                _make_completion_generate_response(ids1, gr1["request_id"]),
                _make_completion_generate_response(ids2, gr2["request_id"]),
            ],
        },
    )
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "text_completion"
    choices = data["choices"]
    assert len(choices) == 2
    assert choices[0]["index"] == 0
    assert choices[1]["index"] == 1
    assert choices[0]["text"]
    assert choices[1]["text"]


@case
def test_derender_completion_usage_aggregation(client: httpx.Client, model: str) -> None:
    gr1 = _render_completion(client, model, "Hello")
    gr2 = _render_completion(client, model, "World")
    ids1, ids2 = gr1["token_ids"][:3], gr2["token_ids"][:4]
    response = client.post(
        "/v1/completions/derender",
        json={
            "model": model,
            "generate_responses": [
                _make_completion_generate_response(ids1, gr1["request_id"]),
                _make_completion_generate_response(ids2, gr2["request_id"]),
            ],
            "prompt_tokens": [5, 10],
        },
    )
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == 15
    assert usage["completion_tokens"] == len(ids1) + len(ids2)
    assert usage["total_tokens"] == 15 + len(ids1) + len(ids2)


def _one_response(client: httpx.Client, model: str, **extra: object) -> httpx.Response:
    gr1 = _render_completion(client, model, "Hello")
    ids1 = gr1["token_ids"][:3]
    return client.post(
        "/v1/completions/derender",
        json={
            "model": model,
            "generate_responses": [_make_completion_generate_response(ids1, gr1["request_id"])],
            **extra,
        },
    )


@case
def test_derender_completion_prompt_tokens_length_mismatch(
    client: httpx.Client, model: str
) -> None:
    response = _one_response(client, model, prompt_tokens=[5, 10])
    assert response.status_code == 400


@case
def test_derender_completion_prompt_token_ids_length_mismatch(
    client: httpx.Client, model: str
) -> None:
    response = _one_response(client, model, prompt_token_ids=[[1, 2], [3, 4]])
    assert response.status_code == 400


@case
def test_derender_completion_oversized_prompt_token_ids_rejected(
    client: httpx.Client, model: str
) -> None:
    response = _one_response(client, model, prompt_token_ids=[[42] * 1_000_000])
    assert response.status_code == 400
    assert "max_model_len" in response.json()["error"]["message"]


@case
def test_derender_completion_empty_generate_responses(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/completions/derender", json={"model": model, "generate_responses": []}
    )
    assert response.status_code == 400


@case
def test_derender_completion_kv_transfer_params_passthrough(
    client: httpx.Client, model: str
) -> None:
    gr1 = _render_completion(client, model, "Hello")
    kv = {"node": "abc"}
    response = client.post(
        "/v1/completions/derender",
        json={
            "model": model,
            "generate_responses": [
                _make_completion_generate_response(
                    gr1["token_ids"][:3], gr1["request_id"], kv_transfer_params=kv
                )
            ],
        },
    )
    assert response.status_code == 200
    assert response.json()["kv_transfer_params"] == kv


@case
def test_derender_chat_bounded_payload_succeeds(client: httpx.Client, model: str) -> None:
    synthetic_ids = _render_chat(client, model)["token_ids"][:5]
    response = _chat(
        client, {"model": model, "generate_response": _make_generate_response(synthetic_ids)}
    )
    assert response.status_code == 200
    data = response.json()
    assert len(data["choices"]) == 1
    assert data["choices"][0]["message"]["content"]


@case
def test_derender_chat_oversized_token_ids_rejected(client: httpx.Client, model: str) -> None:
    assert client.get("/v1/models").status_code == 200
    response = _chat(
        client, {"model": model, "generate_response": _make_generate_response([42] * 1_000_000)}
    )
    assert response.status_code == 400
    assert "max_model_len" in response.json()["error"]["message"]


@case
def test_derender_chat_too_many_choices_rejected(client: httpx.Client, model: str) -> None:
    choices = [{"index": i, "token_ids": [42], "finish_reason": "stop"} for i in range(20_000)]
    response = _chat(
        client,
        {
            "model": model,
            "generate_response": {"request_id": "test-choices-bound", "choices": choices},
        },
    )
    assert response.status_code == 400
    assert "choices count" in response.json()["error"]["message"]


@case
def test_derender_completion_too_many_generate_responses_rejected(
    client: httpx.Client, model: str
) -> None:
    oversized = [
        {
            "request_id": f"gen-{i}",
            "choices": [{"index": 0, "token_ids": [42], "finish_reason": "stop"}],
        }
        for i in range(20_000)
    ]
    response = client.post(
        "/v1/completions/derender", json={"model": model, "generate_responses": oversized}
    )
    assert response.status_code == 400
    assert "generate_responses count" in response.json()["error"]["message"]


@case
def test_derender_chat_negative_token_ids_rejected(client: httpx.Client, model: str) -> None:
    response = _chat(
        client, {"model": model, "generate_response": _make_generate_response([-1, 42, 100])}
    )
    assert response.status_code == 400


@case
def test_derender_completion_oversized_token_ids_rejected(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/completions/derender",
        json={
            "model": model,
            "generate_responses": [
                {
                    "request_id": "gen-0",
                    "choices": [
                        {"index": 0, "token_ids": [42] * 1_000_000, "finish_reason": "stop"}
                    ],
                }
            ],
        },
    )
    assert response.status_code == 400
    assert "max_model_len" in response.json()["error"]["message"]
