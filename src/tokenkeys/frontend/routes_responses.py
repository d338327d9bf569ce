"""``POST /v1/responses/render``: the engine request of an OpenAI Responses request.

As vLLM 0.32's render server (``scale_out/render/serving.py`` ``render_responses_request``):
the input items and instructions are converted into chat messages
(:mod:`tokenkeys.preprocess.responses`), rendered by the model's one Preprocessor, and answered
as a ``GenerateRequest`` whose id is the request's own (``request_id``, else ``resp_`` and a
random id), whose budget is ``max_output_tokens`` within the context left, without
``stream_options``, with the request's ``kv_transfer_params``. A ``previous_response_id`` is
vLLM's 400: the render endpoint is stateless. ``/v1/responses`` (generation) is not served yet.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from tokenkeys.frontend.body import json_response
from tokenkeys.frontend.errors import error_body, error_json
from tokenkeys.frontend.openapi import add_body_route
from tokenkeys.frontend.render_params import sampling_params
from tokenkeys.frontend.routes_render import answer_of, budget_of, context_of, defaults_of
from tokenkeys.frontend.routes_render import open_render as open_request
from tokenkeys.frontend.schemas import RenderResponsesRequest
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
    "stream",
)


async def render_responses(request: Request) -> Response:
    """The engine request of a Responses request (vLLM's render API)."""
    opened = await open_request(request, RenderResponsesRequest, None)
    body, model = opened.body, opened.model
    if body.get("previous_response_id") is not None:
        # vLLM's words and its error type for this one refusal (create_error_response's).
        message = "previous_response_id is not supported by the stateless render endpoint."
        kind = "invalid_request_error"
        return error_json(error_body(message, kind, 400, "previous_response_id"), 400)
    limit = context_of(model)
    chat = dataclasses.replace(opened, body=to_chat_request(body))
    rendered = await chat.run(model.preprocessor.tokenize_chat, chat.body)
    ids = rendered.tokens.ids
    defaults = defaults_of(model)
    budget = budget_of(len(ids), body.get("max_output_tokens"), defaults, limit, text=True)
    sampling: dict[str, Any] = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
    params = sampling_params(sampling, budget, defaults, chat=True)
    # ResponsesRequest.to_sampling_params always passes extra_args (a dict, empty without
    # vllm_xargs or transfer parameters), where chat passes None.
    params.setdefault("extra_args", {})
    request_id = body.get("request_id") or f"resp_{uuid.uuid4().hex}"
    answer = answer_of(request_id, ids, params, {**body, "stream_options": None})
    answer["kv_transfer_params"] = body.get("kv_transfer_params")
    answer["ec_transfer_params"] = body.get("ec_transfer_params")
    return json_response(answer)


def add_routes(app: FastAPI) -> None:
    """Mount the Responses render route."""
    add_body_route(
        app,
        "/v1/responses/render",
        render_responses,
        RenderResponsesRequest,
        summary="The engine request of an OpenAI Responses request (vLLM's render API)",
    )
