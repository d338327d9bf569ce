"""vLLM 0.32's token-out answers and the derender stream's state (``scale_out/token_in_token_out/
protocol.py``): what a derender request carries for :mod:`tokenkeys.derender.answers` to turn
back into an OpenAI answer.

``GenerateResponse`` is ``/inference/v1/generate``'s whole answer, ``GenerateChunk`` one chunk of
its stream, ``StreamState`` the ``DerenderStreamState`` a streaming client carries between calls.
Only ``output_mode: "tokens"`` answers are derendered (text answers were detokenized by the
engine already). Strict, extra keys ignored, violations are 400s naming the field, as vLLM's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator

Json = dict[str, Any]


class Body(BaseModel):
    """The derender models' base: strict types, extra keys ignored (as vLLM's)."""

    model_config = ConfigDict(extra="ignore", strict=True)


class GenerateLogProb(Body):
    """One (token id, logprob) candidate."""

    token_id: int
    logprob: float
    rank: int | None = None


class GenerateLogProbsContent(GenerateLogProb):
    """The sampled token at one position and its top candidates."""

    top_logprobs: list[GenerateLogProb] = Field(default_factory=list)


class GenerateLogProbs(Body):
    """Output logprobs of one choice, one entry per generated token."""

    content: list[GenerateLogProbsContent] | None = None


class GenerateChoice(Body):
    """One choice of a token-out answer."""

    index: int
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[NonNegativeInt] | None = None
    logprobs: GenerateLogProbs | None = None


class GenerateStreamChoice(GenerateChoice):
    """One choice of a token-out stream chunk (no finish reason until the last)."""

    finish_reason: str | None = None


class _GenerateBase(Body):
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


class StreamState(Body):
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
