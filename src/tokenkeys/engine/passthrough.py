"""Engines that answer OpenAI generation requests themselves: the HTTP pass-through.

An engine with its own OpenAI server (a real vLLM behind the sidecar) is handed the whole
request instead of :class:`~tokenkeys.engine.protocol.GenerationParams`: every field keeps the
meaning that server gives it, and its answer (text, logprobs, choices, finish reasons, usage)
goes back to the client as it sent it. The prompt is still the Preprocessor's: the routes
tokenize first and the engine sends those ids. What an engine cannot pass exactly it names in
:meth:`OpenAIPassThrough.refusal` (a 501 naming the field).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from tokenkeys.engine.protocol import Usage
from tokenkeys.keys import KeyContext

#: The generation routes handed through; "messages" is Anthropic's and "responses" OpenAI's
#: Responses API (each with its body as sent).
Route = Literal["completions", "chat", "messages", "responses"]


@dataclass(frozen=True)
class OpenAIRequest:
    """One generation request as the client sent it, with the Preprocessor's prompt ids.

    ``prompts``: one id list per prompt (completions), or the one rendered chat prompt.
    ``prompt_text``: the rendered chat prompt (None for completions and token-in chat).
    ``headers``: the request headers the engine's server reads (``X-Request-Id``).
    """

    route: Route
    body: Mapping[str, Any]
    prompts: list[list[int]]
    context: KeyContext | None
    lora_name: str | None
    headers: Mapping[str, str]
    prompt_text: str | None = None


@dataclass
class OpenAIAnswer:
    """The engine's answer: a whole body, or server-sent events (``events`` set).

    ``usage`` collects what the answer reported, per prompt (filled while ``events`` runs).
    """

    status: int
    body: bytes = b""
    events: AsyncIterator[bytes] | None = None
    usage: list[Usage] = field(default_factory=list)


@runtime_checkable
class OpenAIPassThrough(Protocol):
    """An engine the generation routes hand whole OpenAI requests to; see the module doc."""

    def refusal(self, body: Mapping[str, Any], route: Route) -> tuple[str, str] | None:
        """The first field this engine cannot pass exactly, as (field, reason), or None."""
        ...

    def embedded_prompt(
        self, body: Mapping[str, Any], context: KeyContext | None
    ) -> tuple[list[int], KeyContext]:
        """A completions ``prompt_embeds`` body's prompt as the engine keys it (its ids and key
        context), once :meth:`refusal` let it pass; InvalidArgument for a tensor it cannot read."""
        ...

    async def answer(self, request: OpenAIRequest) -> OpenAIAnswer:
        """Forward ``request``; the engine's answer (its own status on a refusal)."""
        ...
