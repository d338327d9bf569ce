"""vLLM 0.32's derender routes: a token-out engine answer back into an OpenAI answer.

``POST /v1/completions/derender`` and ``/v1/chat/completions/derender`` take the answer (or one
stream chunk and the client-carried ``stream_state``) of ``/inference/v1/generate`` for a
request ``/render`` rendered, and answer the ``CompletionResponse`` / ``ChatCompletionResponse``
(or the chunk and the next state) vLLM's render server answers: plain text by vLLM's incremental
detokenization on the model's tokenizer (:mod:`tokenkeys.derender`). Order of checks, vLLM's:
body (400), model (404), bounds (400), prompt ids within the context (400). Not rebuilt here
(501 naming the field): per-request metrics, prompt logprobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from tokenkeys.derender import answers
from tokenkeys.derender.logprobs import Speller
from tokenkeys.derender.pieces import pieces_of
from tokenkeys.errors import InvalidArgument
from tokenkeys.frontend.body import json_response, validate
from tokenkeys.frontend.openapi import add_body_route
from tokenkeys.frontend.opening import Opened, Schema
from tokenkeys.frontend.routes_render import context_of, open_render
from tokenkeys.frontend.schemas import ChatCompletionRequest, CompletionRequest
from tokenkeys.frontend.schemas_derender import (
    DerenderChat,
    DerenderChatStream,
    DerenderCompletion,
    DerenderCompletionStream,
    chat_schema,
    completion_schema,
)


def _speller(opened: Opened) -> Speller:
    """The model's pieces and its decode (special tokens kept: each id is spelled alone)."""
    tokenizer = opened.model.tokenizer

    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode([ids], skip_special_tokens=False)[0]

    return Speller(decode, pieces_of(tokenizer))


def _model_name(opened: Opened) -> str:
    return opened.body.get("model") or opened.model.name


async def _chunk(
    opened: Opened,
    stream: DerenderChatStream | DerenderCompletionStream,
    original: dict[str, Any] | None,
) -> Response:
    """One stream chunk derendered."""
    answers.refuse_unrebuilt(stream.generate_chunk)
    chunk = await opened.run(
        answers.stream_chunk,
        isinstance(stream, DerenderChatStream),
        _speller(opened),
        stream.generate_chunk,
        stream.stream_state,
        _model_name(opened),
        stream.prompt_tokens,
        stream.prompt_token_ids,
        original,
    )
    return json_response(chunk)


async def _open(
    request: Request, schema: Schema, name: str, checked: type[BaseModel]
) -> tuple[Opened, int, dict[str, Any] | None]:
    """The opened body, the model's context and the original request (``name``, checked
    against ``checked``, as vLLM validates it)."""
    opened = await open_render(request, schema, None)
    original = opened.body.get(name)
    if original is not None:
        validate(checked, original)
    return opened, context_of(opened.model), original


async def derender_chat(request: Request) -> Response:
    """A chat answer (or one stream chunk of it) from the engine's output ids."""
    opened, limit, original = await _open(
        request, chat_schema, "chat_request", ChatCompletionRequest
    )
    body = opened.body
    if body.get("stream") is True:
        stream = DerenderChatStream.model_validate(body)
        prior = len(stream.stream_state.output_token_ids) if stream.stream_state else 0
        given = len(stream.prompt_token_ids or ())
        delta = sum(len(c.token_ids or ()) for c in stream.generate_chunk.choices)
        if len(stream.generate_chunk.choices) > 1:
            raise InvalidArgument(
                "derender_chat_stream expects at most one choice per chunk "
                f"(got {len(stream.generate_chunk.choices)})."
            )
        if given + prior + delta > limit:
            raise InvalidArgument(
                f"prompt_token_ids length ({given}) plus output_token_ids length ({prior}) "
                f"plus delta ({delta}) exceeds max_model_len ({limit})."
            )
        return await _chunk(opened, stream, original)
    whole = DerenderChat.model_validate(body)
    answers.check_bounds([whole.generate_response], limit)
    answers.check_prompt_ids([whole.prompt_token_ids], limit)
    answers.refuse_unrebuilt(whole.generate_response)
    answer = await opened.run(
        answers.chat_answer,
        _speller(opened),
        whole.generate_response,
        _model_name(opened),
        whole.prompt_tokens,
        whole.prompt_token_ids,
        original,
    )
    return json_response(answer)


async def derender_completion(request: Request) -> Response:
    """A completion answer (or one stream chunk of it) from the engine's output ids."""
    opened, limit, original = await _open(
        request, completion_schema, "completion_request", CompletionRequest
    )
    body = opened.body
    if body.get("stream") is True:
        stream = DerenderCompletionStream.model_validate(body)
        answers.check_prompt_ids([stream.prompt_token_ids], limit)
        return await _chunk(opened, stream, original)
    whole = DerenderCompletion.model_validate(body)
    if not whole.generate_responses:
        raise InvalidArgument("generate_responses must not be empty", field="generate_responses")
    answers.check_bounds(whole.generate_responses, limit)
    answers.check_prompt_ids(whole.prompt_token_ids or [], limit)
    for answer in whole.generate_responses:
        answers.refuse_unrebuilt(answer)
    result = await opened.run(
        answers.completion_answer,
        _speller(opened),
        whole.generate_responses,
        _model_name(opened),
        whole.prompt_tokens,
        whole.prompt_token_ids,
        original,
    )
    return json_response(result)


def add_routes(app: FastAPI) -> None:
    """Mount the two derender routes."""
    add_body_route(
        app,
        "/v1/completions/derender",
        derender_completion,
        DerenderCompletion,
        summary="A completion answer from token-out engine output (vLLM's derender API)",
    )
    add_body_route(
        app,
        "/v1/chat/completions/derender",
        derender_chat,
        DerenderChat,
        summary="A chat answer from token-out engine output (vLLM's derender API)",
    )
