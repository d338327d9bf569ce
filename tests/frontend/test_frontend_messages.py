"""Anthropic Messages on a real loopback server with the simulated engine (issue 34).

The served number: a Messages conversation counts (``count_tokens``), renders and generates
(``usage``) exactly the ids of its chat conversion on /tokenize, for the whole systematic corpus.
Refusals: bad blocks 400 naming the field, images and what the simulated engine does not do 501.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic_corpus
import httpx
import pytest

from tokenkeys.preprocess.anthropic import to_chat_request

from http_support import served_as

NAME = "smollm2"


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with served_as(NAME) as (c, _models):
        yield c


def _ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def test_count_render_and_usage_are_the_chat_count_of_the_conversion(client) -> None:
    corpus = anthropic_corpus.messages_requests() + anthropic_corpus.tool_requests()
    for label, body in corpus:
        body = {"model": NAME, **body}
        # SmolLM2's template renders a system turn anywhere: nothing is merged.
        chat = to_chat_request(body, merge_inline_system=False, count=True)
        ids = _ok(client.post("/tokenize", json=chat))["tokens"]
        counted = {k: v for k, v in body.items() if k not in ("max_tokens", "stop_sequences")}
        count = _ok(client.post("/v1/messages/count_tokens", json=counted))
        assert count == {
            "input_tokens": len(ids),
            "context_management": {"original_input_tokens": len(ids)},
        }, label
        render = _ok(client.post("/v1/messages/render", json=body))
        assert render["token_ids"] == ids, label
        assert render["request_id"].startswith("chatcmpl-")
        plain = {k: v for k, v in body.items() if k != "stop_sequences"}
        answer = _ok(client.post("/v1/messages", json=plain))
        usage = answer["usage"]
        # Anthropic's total, split as vLLM 0.32 splits it (cache creation included).
        split = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        assert sum(usage[k] for k in split) == len(ids), label
        assert answer["type"] == "message" and answer["role"] == "assistant"
        assert answer["content"][0]["type"] == "text"
        assert answer["stop_reason"] in ("max_tokens", "end_turn")


USER = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "bogus"}]}]}, 400, "messages"),
        ({"messages": USER, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": USER, "tool_choice": {"type": "tool"}}, 400, "tool_choice"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "x"}}],
                    }
                ]
            },
            400,
            "messages[0].content[0]",
        ),
        ({"messages": USER, "stream": True}, 501, "stream"),
        ({"messages": USER, "stop_sequences": ["x"]}, 501, "stop"),
    ],
)
def test_refusals_name_the_field(client, body: dict, status: int, field: str | None) -> None:
    answer = client.post("/v1/messages", json={"model": NAME, "max_tokens": 4, **body})
    assert answer.status_code == status, answer.text
    if status != 200 and field is not None:
        error = answer.json()["error"]
        assert field in (error.get("param") or "") + error["message"]


def test_image_for_a_text_only_model_is_vllms_400_on_count_and_render(client) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A"}}
    body = {"model": NAME, "max_tokens": 4, "messages": [{"role": "user", "content": [image]}]}
    for path in ("/v1/messages/count_tokens", "/v1/messages/render"):
        answer = client.post(path, json=body)
        assert answer.status_code == 400, answer.text
        assert "is not a multimodal model" in answer.json()["error"]["message"]
