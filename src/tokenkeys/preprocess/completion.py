"""Completion requests: the prompt forms of /v1/completions and which of their fields apply.

The prompt is what OpenAI's completions API accepts and vLLM passes on (0.33-era ``main``,
``vllm/entrypoints/openai/completion/protocol.py``): a string, a list of strings, a list of
token ids, or a list of token-id lists. Texts are encoded by the
:class:`~tokenkeys.preprocess.Preprocessor`; token ids reach the engine unchanged (checked
against the vocabulary). :func:`unsupported_reason` is the one rule that /v1/completions and the
completion form of /tokenize both consult.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenkeys.errors import InvalidArgument, vllm_invalid
from tokenkeys.preprocess.prompt_options import shared_prompt_reason

Prompt = str | list[int]


def unsupported_reason(request: Mapping[str, Any]) -> str | None:
    """Why this completion request's prompt cannot be built exactly here, or None when it can:
    the prompt-changing fields of :mod:`tokenkeys.preprocess.prompt_options`.
    """
    return shared_prompt_reason(request)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def refuse_empty_prompt(request: Mapping[str, Any]) -> None:
    """An empty prompt is a bad request for generation, as vLLM 0.32 answers it
    (``CompletionRequest.validate_prompt_and_prompt_embeds``, its message). vLLM's /tokenize
    counts it (its tokenize request has no such validator, checked live), so only the
    generation route calls this."""
    if request.get("prompt") == "":
        raise vllm_invalid(
            "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
        )


def prompts_of(request: Mapping[str, Any]) -> list[Prompt]:
    """The prompts of a completion request, each a text or a list of token ids, in order."""
    if request.get("suffix") is not None:
        # vLLM 0.32 renders a suffix only for models with a fill-in-the-middle renderer
        # (DeepSeek V4) and answers every other one this 400 (vllm/renderers/online_renderer.py
        # render_completion); no model here has such a renderer.
        raise InvalidArgument(
            "suffix is only supported for models with FIM completion rendering", field="suffix"
        )
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(_is_id(t) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    if prompt is None:
        raise InvalidArgument("prompt is required", field="prompt")
    raise InvalidArgument(
        "prompt must be a string, a non-empty list of strings, a non-empty list of token ids "
        f"or a non-empty list of non-empty token-id lists; got {_describe(prompt)}",
        field="prompt",
    )


def _describe(value: Any) -> str:
    if isinstance(value, list):
        if not value:
            return "an empty list"
        kinds = sorted({type(v).__name__ for v in value})
        return f"a list of {'/'.join(kinds)}"
    return type(value).__name__
