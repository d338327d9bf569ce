"""The sidecar's pass-through rules that need no running vLLM: what is refused, what vLLM gets.

Against a real vLLM: ``tests/realengine/test_vllm_passthrough.py``.
"""

from __future__ import annotations

import pytest

from tokenkeys.engine.passthrough import OpenAIRequest
from tokenkeys.engine.protocol import GenerationParams
from tokenkeys.engine.vllm.openai import completion_body, refusal, vllm_body
from tokenkeys.errors import Unsupported
from tokenkeys.keys import KeyContext, MMItem

CHAT = [{"role": "user", "content": "Hi"}]


def _request(route, body, prompts, text=None):  # noqa: ANN001, ANN202
    return OpenAIRequest(route, body, prompts, None, None, {}, text)


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("chat", {"messages": CHAT, "echo": True}, "echo"),
        ("completions", {"prompt": "text", "echo": True}, "echo"),
        ("completions", {"prompt": ["a", [1, 2]], "echo": True}, "echo"),
        ("chat", {"messages": CHAT, "kv_transfer_params": {"do_remote_decode": True}}, None),
        ("completions", {"prompt": [1], "kv_transfer_params": {"prompt_token_ids": [1]}}, None),
    ],
)
def test_what_cannot_pass_exactly_is_named(route, body, field) -> None:
    refused = refusal(body, route)
    assert refused is not None
    assert refused[0] == (field or "kv_transfer_params")


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("completions", {"prompt": [1, 2, 3], "echo": True, "logprobs": 2, "n": 3}),
        ("chat", {"messages": CHAT, "kv_transfer_params": {"prompt_token_ids": [5, 6]}}),
        ("chat", {"messages": CHAT, "tools": [], "response_format": {"type": "json_object"}}),
    ],
)
def test_every_other_field_passes(route, body) -> None:
    assert refusal(body, route) is None


def test_completions_carry_the_preprocessors_ids_and_every_other_field() -> None:
    body = {"model": "adapter", "prompt": "text", "add_special_tokens": True, "top_k": 3}
    sent = vllm_body(_request("completions", body, [[1, 2]]), "adapter")
    assert sent == {"model": "adapter", "prompt": [1, 2], "top_k": 3}
    two = vllm_body(_request("completions", {"prompt": ["a", "b"]}, [[1], [2]]), "m")
    assert two["prompt"] == [[1], [2]]
    assert body["prompt"] == "text"  # the client's body is not changed


def test_chat_carries_the_ids_as_vllms_token_in_chat_beside_the_messages() -> None:
    body = {"messages": CHAT, "tools": [{"type": "function"}], "stream": True}
    sent = vllm_body(_request("chat", body, [[7, 8, 9]], "<prompt>"), "m")
    assert sent["kv_transfer_params"] == {"prompt_token_ids": [7, 8, 9]}
    assert sent["messages"] == CHAT and sent["tools"] == body["tools"]
    assert "stream_options" not in sent  # vLLM's stream as the client asked for it


def test_generate_bodies_carry_the_ids_and_refuse_image_items() -> None:
    """gRPC Generate's completion body: the ids, the rest of the context when max_tokens is
    unset, the salt; image items are refused (vLLM's completions would key them as text)."""
    params = GenerationParams(seed=3, stop_token_ids=(7,))
    body = completion_body([1, 2, 3], params, KeyContext(cache_salt="s"), "tiny", 100)
    assert body == {
        "model": "tiny",
        "prompt": [1, 2, 3],
        "max_tokens": 97,
        "seed": 3,
        "stop_token_ids": [7],
        "cache_salt": "s",
    }
    images = KeyContext(mm_items=(MMItem("a" * 64, 1, 2),))
    with pytest.raises(Unsupported) as info:
        completion_body([1, 2, 3], params, images, "tiny", 100)
    assert info.value.field == "media"
