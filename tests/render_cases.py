"""vLLM's own render tests (``tests/entrypoints/scale_out/render/test_render.py``, its HTTP
cases), ported with their requests and assertions unchanged, run against any server by
``CASES[name](client, model)``.

As :mod:`derender_cases`: only the harness changes (a synchronous ``httpx.Client`` on the server
under test, the served model's name for ``MODEL_NAME``), and the suite runs every case against
both ``vllm launch render`` 0.32 and tokenkeys (tests/realengine/test_vllm_render.py), so a case
that vLLM 0.32 itself does not pass would show there. ``token_ids[0] == 1`` holds for the
suite's models as for vLLM's tiny Llama: their chat template opens with ``<|im_start|>``, id 1.

Left out, and why: the cases that call vLLM's internals with mocks (``ServingRender``, its
router's route table); ``test_completion_render_no_generation`` (a timed assertion, which this
suite does not make: render's ids are compared with vLLM's instead); and cases of the stored
version (newer than 0.32) that vLLM 0.32 cannot be the judge of: those asking for token offsets
(``return_token_offsets: true``; 0.32's completion and chat requests have no such field and
answer ``token_offsets: null``, which the cases kept here check) or setting ``truncation_side``
(not a field of 0.32's completion and chat requests), those sending their own chat template
(vLLM's fixture starts its server with ``--trust-request-chat-template``; neither server here
is), and ``test_messages_render_merges_inline_system``, which ``vllm launch render`` 0.32 fails
(it does not merge an inline system turn into the leading system block).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

CASES: dict[str, Callable[[httpx.Client, str], None]] = {}


def case(fn: Callable[[httpx.Client, str], None]) -> Callable[[httpx.Client, str], None]:
    CASES[fn.__name__] = fn
    return fn


@case
def test_completion_render_basic(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/completions/render",
        json={
            "model": model,
            "prompt": "When should a chat-completions handler return an empty string?",
        },
    )
    assert response.status_code == 200
    data = response.json()
    assert isinstance(data, list)
    assert len(data) > 0
    first_prompt = data[0]
    assert "token_ids" in first_prompt
    assert "sampling_params" in first_prompt
    assert "model" in first_prompt
    assert "request_id" in first_prompt
    assert isinstance(first_prompt["token_ids"], list)
    assert len(first_prompt["token_ids"]) > 0
    assert first_prompt["model"] == model
    assert first_prompt["request_id"].startswith("cmpl-")


@case
def test_chat_completion_render_basic(client: httpx.Client, model: str) -> None:
    content = "Returning an empty string for the prompt may be confusing."
    response = client.post(
        "/v1/chat/completions/render",
        json={"model": model, "messages": [{"role": "user", "content": content}]},
    )
    assert response.status_code == 200
    data = response.json()
    assert isinstance(data, dict)
    assert "token_ids" in data
    assert isinstance(data["token_ids"], list)
    assert len(data["token_ids"]) > 0
    token_ids = data["token_ids"]
    assert all(isinstance(tid, int) for tid in token_ids)
    assert token_ids[0] == 1


@case
def test_completion_render_multiple_prompts(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/completions/render",
        json={"model": model, "prompt": ["Hello world", "Goodbye world"]},
    )
    assert response.status_code == 200
    data = response.json()
    assert isinstance(data, list)
    assert len(data) == 2
    for prompt in data:
        assert "token_ids" in prompt
        assert "sampling_params" in prompt
        assert "model" in prompt
        assert "request_id" in prompt
        assert len(prompt["token_ids"]) > 0
        assert prompt["request_id"].startswith("cmpl-")


@case
def test_chat_completion_render_multi_turn(client: httpx.Client, model: str) -> None:
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
        {"role": "user", "content": "How are you?"},
    ]
    response = client.post(
        "/v1/chat/completions/render", json={"model": model, "messages": messages}
    )
    assert response.status_code == 200
    data = response.json()
    assert isinstance(data, dict)
    assert "token_ids" in data
    assert isinstance(data["token_ids"], list)
    assert len(data["token_ids"]) > 0


@case
def test_chat_completion_render_with_stream_true(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/chat/completions/render",
        json={
            "model": model,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "messages": [
                {"role": "user", "content": "Stream options should be accepted by /render."}
            ],
        },
    )
    assert response.status_code == 200
    assert response.headers.get("content-type", "").startswith("application/json")
    data = response.json()
    assert isinstance(data, dict)
    assert "token_ids" in data
    assert isinstance(data["token_ids"], list)
    assert len(data["token_ids"]) > 0
    assert data.get("stream") is True
    assert isinstance(data.get("stream_options"), dict)
    assert data["stream_options"].get("include_usage") is True
    assert data["stream_options"].get("continuous_usage_stats") is True


@case
def test_completion_render_error_invalid_model(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/completions/render", json={"model": "invalid-model-name", "prompt": "Hello"}
    )
    assert response.status_code == 404
    assert "error" in response.json()


@case
def test_chat_completion_render_error_invalid_model(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/chat/completions/render",
        json={"model": "invalid-model-name", "messages": [{"role": "user", "content": "Hello"}]},
    )
    assert response.status_code == 404
    assert "error" in response.json()


@case
def test_chat_completion_render_with_sampling_params(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/chat/completions/render",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "Test sampling params"}],
            "temperature": 0.123,
            "top_p": 0.456,
            "frequency_penalty": 1.1,
        },
    )
    assert response.status_code == 200
    data = response.json()
    assert "sampling_params" in data
    sampling_params = data["sampling_params"]
    assert sampling_params.get("temperature") == 0.123
    assert sampling_params.get("top_p") == 0.456
    assert sampling_params.get("frequency_penalty") == 1.1
    assert "_all_stop_token_ids" not in sampling_params


@case
def test_responses_render_basic(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/responses/render",
        json={
            "model": model,
            "input": "When should a Responses handler return an empty string?",
            "max_output_tokens": 7,
        },
    )
    assert response.status_code == 200
    data = response.json()
    assert data["model"] == model
    assert data["request_id"].startswith("resp_")
    assert data["sampling_params"]["max_tokens"] == 7
    assert data["token_ids"]


@case
def test_responses_render_includes_prior_input_items(client: httpx.Client, model: str) -> None:
    current_turn = {"role": "user", "content": "Which color should I remember?"}
    current = client.post("/v1/responses/render", json={"model": model, "input": [current_turn]})
    earlier = [
        {"role": "user", "content": "Remember the color cobalt."},
        {"role": "assistant", "content": "I will remember cobalt."},
    ]
    multi = client.post(
        "/v1/responses/render", json={"model": model, "input": [*earlier, current_turn]}
    )
    assert current.status_code == 200
    assert multi.status_code == 200
    assert len(multi.json()["token_ids"]) > len(current.json()["token_ids"])


@case
def test_responses_render_rejects_previous_response_id_over_http(
    client: httpx.Client, model: str
) -> None:
    response = client.post(
        "/v1/responses/render",
        json={
            "model": model,
            "input": "Continue the previous response.",
            "previous_response_id": "resp_previous",
        },
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "previous_response_id"


@case
def test_messages_render_basic(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/messages/render",
        json={
            "model": model,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "Render this Anthropic message."}],
        },
    )
    assert response.status_code == 200
    data = response.json()
    assert isinstance(data, dict)
    assert "token_ids" in data
    assert "sampling_params" in data
    assert "model" in data
    assert data["model"] == model
    token_ids = data["token_ids"]
    assert isinstance(token_ids, list)
    assert len(token_ids) > 0
    assert all(isinstance(tid, int) for tid in token_ids)
    assert token_ids[0] == 1


_TURNS = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi! How can I help?"},
]
_QUESTION = {"role": "user", "content": "What is 2 + 2?"}


@case
def test_messages_render_system_and_multi_turn(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/messages/render",
        json={
            "model": model,
            "max_tokens": 16,
            "system": "You are a helpful assistant.",
            "messages": [*_TURNS, _QUESTION],
        },
    )
    assert response.status_code == 200
    data = response.json()
    assert isinstance(data, dict)
    assert len(data["token_ids"]) > 0
    assert data["token_ids"][0] == 1


@case
def test_messages_render_error_invalid_model(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/messages/render",
        json={
            "model": "invalid-model-name",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "Hello"}],
        },
    )
    assert response.status_code == 404
    assert "error" in response.json()


@case
def test_completion_render_default_no_token_offsets(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/completions/render", json={"model": model, "prompt": "Hello, world."}
    )
    assert response.status_code == 200
    assert response.json()[0]["token_offsets"] is None


@case
def test_chat_render_default_no_token_offsets(client: httpx.Client, model: str) -> None:
    response = client.post(
        "/v1/chat/completions/render",
        json={"model": model, "messages": [{"role": "user", "content": "Hello, world."}]},
    )
    assert response.status_code == 200
    assert response.json()["token_offsets"] is None


@case
def test_chat_completion_render_assistant_tokens_mask_default(
    client: httpx.Client, model: str
) -> None:
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "How are you?"},
    ]
    response = client.post(
        "/v1/chat/completions/render", json={"model": model, "messages": messages}
    )
    assert response.status_code == 200
    assert response.json().get("assistant_tokens_mask") is None


@case
def test_chat_completion_render_assistant_tokens_mask_false(
    client: httpx.Client, model: str
) -> None:
    response = client.post(
        "/v1/chat/completions/render",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "Hello"}],
            "return_assistant_tokens_mask": False,
        },
    )
    assert response.status_code == 200
    assert response.json().get("assistant_tokens_mask") is None


@case
def test_chat_render_assistant_tokens_mask_null_without_gen_tags(
    client: httpx.Client, model: str
) -> None:
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"}]
    response = client.post(
        "/v1/chat/completions/render",
        json={"model": model, "messages": messages, "return_assistant_tokens_mask": True},
    )
    assert response.status_code == 200
    assert response.json().get("assistant_tokens_mask") is None
