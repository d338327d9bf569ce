"""Anthropic's Messages API on the one path: ``/v1/messages``, its ``count_tokens`` and ``render``.

Each route validates the body as vLLM 0.32 does (:mod:`tokenkeys.frontend.schemas_anthropic`),
converts it into the chat request vLLM renders (:mod:`tokenkeys.preprocess.anthropic`) and hands
that to the model's one Preprocessor, so every number is the served one:

- ``/v1/messages/render`` answers what ``vllm launch render`` answers (the chat render of the
  converted request, ``chatcmpl-`` id, vLLM's ``render_messages_request``);
- ``/v1/messages/count_tokens`` answers ``{"input_tokens": N, "context_management":
  {"original_input_tokens": N}}``, N the rendered prompt's length (vLLM's ``count_tokens``,
  with its probe for what ``thinking: disabled`` means for the model);
- ``/v1/messages`` generates: in front of a real vLLM the request goes to vLLM's own
  ``/v1/messages`` whole, with the Preprocessor's ids, and its answer or events come back as
  vLLM sent them; on the simulated engine the answer is shaped as vLLM shapes a whole Messages
  answer (``messages_full_converter``; ``usage`` split as vLLM 0.32 splits it, cache creation
  included). Streaming on the simulated engine is refused (501).

Image blocks become the chat's ``image_url`` parts: a model whose processor is reproduced
(``tokenkeys.preprocess.images``) expands them as the chat path does, any other refuses them
with the chat path's 501.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from tokenkeys.engine.passthrough import OpenAIPassThrough
from tokenkeys.engine.protocol import Usage
from tokenkeys.errors import Unsupported
from tokenkeys.frontend import passthrough
from tokenkeys.frontend.body import json_response
from tokenkeys.frontend.generation import cache_creation_tokens
from tokenkeys.frontend.openapi import add_body_route
from tokenkeys.frontend.opening import Opened
from tokenkeys.frontend.render_params import unsupported_render_option
from tokenkeys.frontend.routes_generate import chat_call, decoder
from tokenkeys.frontend.routes_render import (
    MM_PAYLOAD_FIELDS,
    check_chat_body,
    open_render,
    render_chat_opened,
)
from tokenkeys.frontend.schemas_anthropic import CountTokensRequest, MessagesRequest
from tokenkeys.frontend.state import engine_of
from tokenkeys.preprocess.anthropic import chat_body


def _as_chat(opened: Opened, *, count: bool = False) -> Opened:
    """The opened Messages request with its body converted to vLLM's chat request."""
    chat = chat_body(opened.model.preprocessor, opened.body, count=count)
    return dataclasses.replace(opened, body=chat)


async def render_messages(request: Request) -> Response:
    """The engine request of a Messages conversation (vLLM's render API)."""
    given = await open_render(request, MessagesRequest, None)
    opened = _as_chat(given)
    # What the features carry is the Messages request's own choice (vLLM 0.32 sets the chat
    # request's ``mm_payload`` from it: ``scale_out/render/serving.py``).
    payload = {k: given.body[k] for k in MM_PAYLOAD_FIELDS if k in given.body}
    opened = dataclasses.replace(opened, body={**opened.body, **payload})
    check_chat_body(opened.body)
    refused = unsupported_render_option(opened.body)
    if refused is not None:
        raise Unsupported(refused[1], field=refused[0])
    return await render_chat_opened(request, opened)


async def count_tokens(request: Request) -> Response:
    """Anthropic's count: the length of the prompt the conversation renders to."""
    opened = _as_chat(await open_render(request, CountTokensRequest, None), count=True)
    chat = await opened.run(opened.model.preprocessor.tokenize_chat, opened.body)
    n = len(chat.tokens.ids)
    return json_response({"input_tokens": n, "context_management": {"original_input_tokens": n}})


def _stop_reason(finish_reason: str | None) -> str | None:
    """``_to_anthropic_stop_reason`` without tools or stop strings (the simulated engine's)."""
    return {"length": "max_tokens", "stop": "end_turn"}.get(finish_reason or "")


def anthropic_usage(usage: Usage, engine: Any) -> dict[str, Any]:
    """vLLM's ``_build_anthropic_usage`` with ``--enable-prompt-tokens-details``: the prompt
    split into uncached, cache-creation and cache-read tokens (Anthropic's total is their sum),
    in vLLM's key order."""
    cached = usage.cached_prompt_tokens
    created = cache_creation_tokens(usage, engine)
    return {
        "input_tokens": max(0, usage.prompt_tokens - cached - created),
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": cached,
    }


async def messages(request: Request) -> Response:
    """Anthropic Messages: generate the answer of a conversation."""
    opened = await open_render(request, MessagesRequest, None)
    model = opened.model
    if isinstance(engine := engine_of(model), OpenAIPassThrough):
        chat = _as_chat(opened)
        # vLLM gets the Messages body as sent; the Preprocessor renders its chat conversion.
        return await passthrough.forward(request, chat, engine, "messages", sent=opened.body)
    if opened.body.get("stream"):
        raise Unsupported(
            "stream is not served on /v1/messages by the simulated engine; send stream: false, "
            "or serve the model in front of a vLLM",
            field="stream",
        )
    opened = _as_chat(opened)
    call, options = chat_call(opened)
    chat = await opened.run(model.preprocessor.tokenize_chat, opened.body)
    ids = chat.tokens.ids
    call.check([ids], rendered=chat.prompt is not None)
    call = call.with_images(chat.features)
    (done,) = await call.run_all([ids])
    opened.state.metrics.record_generation(model.name, "messages", [done.usage])
    text = decoder(model, options.skip_special_tokens)(done.token_ids)
    given = request.headers.get("x-request-id") or opened.body.get("request_id")
    answer = {
        "id": f"chatcmpl-{given or uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": opened.lora or model.name,
        "stop_reason": _stop_reason(done.finish_reason),
        "usage": anthropic_usage(done.usage, engine_of(model)),
    }
    return json_response(answer)


def add_routes(app: FastAPI) -> None:
    """Mount the three Messages routes (one opening step each, as every model route)."""
    add_body_route(
        app,
        "/v1/messages",
        messages,
        MessagesRequest,
        summary="Answer an Anthropic Messages conversation",
    )
    add_body_route(
        app,
        "/v1/messages/count_tokens",
        count_tokens,
        CountTokensRequest,
        summary="The served prompt length of an Anthropic Messages conversation",
    )
    add_body_route(
        app,
        "/v1/messages/render",
        render_messages,
        MessagesRequest,
        summary="The engine request of an Anthropic Messages conversation (vLLM's render API)",
    )
