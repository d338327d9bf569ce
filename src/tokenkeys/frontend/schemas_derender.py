"""Request bodies of vLLM 0.32's derender routes (``scale_out/token_in_token_out/protocol.py``).

A non-streaming body (``stream`` absent or false) carries a whole token-out answer
(``generate_response``, or one per prompt in ``generate_responses``); a streaming one
(``stream: true``) one chunk of ``/inference/v1/generate``'s stream and the client-carried
``stream_state`` (their models: :mod:`tokenkeys.derender.token_out`). Violations are 400s
naming the field, as vLLM's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, NonNegativeInt, model_validator

from tokenkeys.derender.token_out import Body, GenerateChunk, GenerateResponse, Json, StreamState


class DerenderChat(Body):
    """``POST /v1/chat/completions/derender`` with a whole answer."""

    stream: Literal[False] = False
    model: str | None = None
    generate_response: GenerateResponse
    prompt_tokens: int | None = None
    prompt_token_ids: list[NonNegativeInt] | None = None
    chat_request: Json | None = None


class DerenderCompletion(Body):
    """``POST /v1/completions/derender`` with whole answers, one per prompt."""

    stream: Literal[False] = False
    model: str | None = None
    generate_responses: list[GenerateResponse]
    prompt_tokens: list[int] | None = None
    prompt_token_ids: list[list[NonNegativeInt] | None] | None = None
    completion_request: Json | None = None

    @model_validator(mode="after")
    def _one_per_answer(self) -> DerenderCompletion:
        n = len(self.generate_responses)
        for name in ("prompt_tokens", "prompt_token_ids"):
            given = getattr(self, name)
            if given is not None and len(given) != n:
                raise ValueError(
                    f"{name} length ({len(given)}) must equal generate_responses length ({n})"
                )
        return self


class _StreamBody(Body):
    stream: Literal[True]
    model: str | None = None
    generate_chunk: GenerateChunk
    stream_state: StreamState | None = None
    prompt_tokens: int | None = None
    prompt_token_ids: list[NonNegativeInt] | None = None


class DerenderChatStream(_StreamBody):
    """``POST /v1/chat/completions/derender`` with one stream chunk."""

    chat_request: Json | None = None


class DerenderCompletionStream(_StreamBody):
    """``POST /v1/completions/derender`` with one stream chunk."""

    completion_request: Json | None = None


def chat_schema(body: dict[str, Any]) -> type[BaseModel]:
    """The chat derender body's schema, chosen by ``stream`` as vLLM's union does."""
    return DerenderChatStream if body.get("stream") is True else DerenderChat


def completion_schema(body: dict[str, Any]) -> type[BaseModel]:
    """The completions derender body's schema, chosen by ``stream``."""
    return DerenderCompletionStream if body.get("stream") is True else DerenderCompletion
