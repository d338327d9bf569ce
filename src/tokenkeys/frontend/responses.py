"""Response bodies of the HTTP frontend, as OpenAI and vLLM shape them (documentation models).

Routes build plain dicts and serialize them with orjson; these models give /openapi.json the
shapes, and the tests check the answers against them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class TokenizeResponse(_Out):
    """vLLM's ``TokenizeResponse``."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = Field(
        None,
        description="each token's decoded text in context (' world'), or with token_strs_kind "
        "'vocabulary' its vocabulary entry ('Ġworld')",
    )


class DetokenizeResponse(_Out):
    """vLLM's ``DetokenizeResponse``."""

    prompt: str


class TokenizerInfoResponse(_Out):
    """tokenizer_config.json as vLLM reports it, plus this server's identity of the tokenizer."""

    tokenizer_class: str
    fingerprint: str
    backend: str
    add_special_tokens: bool = Field(description="what an unset add_special_tokens means")


class ModelCard(_Out):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "tokenkeys"
    root: str | None = None  # vLLM: --model as given; null while a VLM's is unknown
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(_Out):
    object: str = "list"
    data: list[ModelCard]


class PromptTokensDetails(_Out):
    cached_tokens: int = Field(description="prompt tokens served from the prefix cache")


class UsageBody(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = Field(
        None, description="with return_token_ids: its prompt's ids (streams: first chunk)"
    )
    token_ids: list[int] | None = None


class CompletionResponse(_Out):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageBody | None = Field(None, description="in streams, only with include_usage")


class ChatMessage(_Out):
    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class ChatChoice(_Out):
    index: int
    message: ChatMessage | None = None
    delta: dict[str, Any] | None = Field(None, description="in stream chunks instead of message")
    logprobs: None = None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(_Out):
    id: str
    object: str = Field("chat.completion", description="chat.completion.chunk in streams")
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageBody | None = None
    prompt_token_ids: list[int] | None = Field(
        None, description="with return_token_ids (in streams, on the first chunk)"
    )


class ErrorInfo(_Out):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(_Out):
    """OpenAI's error body, with vLLM's integer ``code`` (the HTTP status)."""

    error: ErrorInfo
