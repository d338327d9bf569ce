"""Request bodies of vLLM 0.32's derender routes (``scale_out/token_in_token_out/protocol.py``).

A non-streaming body (``stream`` absent or false) carries a whole token-out answer
(``generate_response``, or one per prompt in ``generate_responses``); a streaming one
(``stream: true``) one chunk of ``/inference/v1/generate``'s stream and the client-carried
``stream_state``. Only ``output_mode: "tokens"`` answers are derendered (text answers were
detokenized by the engine already). Violations are 400s naming the field, as vLLM's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator

Json = dict[str, Any]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class GenerateLogProb(_Body):
    """One (token id, logprob) candidate."""

    token_id: int
    logprob: float
    rank: int | None = None


class GenerateLogProbsContent(GenerateLogProb):
    """The sampled token at one position and its top candidates."""

    top_logprobs: list[GenerateLogProb] = Field(default_factory=list)


class GenerateLogProbs(_Body):
    """Output logprobs of one choice, one entry per generated token."""

    content: list[GenerateLogProbsContent] | None = None


class GenerateChoice(_Body):
    """One choice of a token-out answer."""

    index: int
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[NonNegativeInt] | None = None
    logprobs: GenerateLogProbs | None = None


class GenerateStreamChoice(GenerateChoice):
    """One choice of a token-out stream chunk (no finish reason until the last)."""

    finish_reason: str | None = None


class _GenerateBase(_Body):
    request_id: str | None = None
    output_mode: Literal["tokens"] = "tokens"
    usage: Json | None = None
    prompt_token_ids: list[NonNegativeInt] | None = None
    metrics: Json | None = None


class GenerateResponse(_GenerateBase):
    """``/inference/v1/generate``'s whole answer (``GenerateTokensResponse``)."""

    choices: list[GenerateChoice]
    prompt_logprobs: list[Any] | None = None
    kv_transfer_params: Json | None = None
    ec_transfer_params: Json | None = None


class GenerateChunk(_GenerateBase):
    """One chunk of its stream (``GenerateTokensStreamResponse``)."""

    choices: list[GenerateStreamChoice]


class StreamState(_Body):
    """vLLM's ``DerenderStreamState``, carried by the client between stream calls."""

    prev_tokens: list[str] = Field(default_factory=list, max_length=1024)
    prefix_offset: NonNegativeInt = 0
    read_offset: NonNegativeInt = 0
    role_sent: bool = False
    logprob_context_token_ids: list[int] = Field(default_factory=list, max_length=4)
    logprob_text_offset: NonNegativeInt = 0
    output_token_ids: list[int] = Field(default_factory=list)
    output_chunk_lens: list[int] = Field(default_factory=list)
    tools_streamed: bool = False
    last_tool_call_ids: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _chunks_cover_the_output(self) -> StreamState:
        if sum(self.output_chunk_lens) != len(self.output_token_ids) or any(
            n <= 0 for n in self.output_chunk_lens
        ):
            raise ValueError("output_chunk_lens must be positive and sum to len(output_token_ids)")
        return self


class DerenderChat(_Body):
    """``POST /v1/chat/completions/derender`` with a whole answer."""

    stream: Literal[False] = False
    model: str | None = None
    generate_response: GenerateResponse
    prompt_tokens: int | None = None
    prompt_token_ids: list[NonNegativeInt] | None = None
    chat_request: Json | None = None


class DerenderCompletion(_Body):
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


class _StreamBody(_Body):
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
