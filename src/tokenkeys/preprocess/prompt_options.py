"""Request fields that change the prompt tokens of either request form and are not applied here.

vLLM's completion and chat requests share a few fields that rewrite the prompt after it is
encoded (``vllm/entrypoints/openai/completion/protocol.py`` and
``chat_completion/protocol.py``, 0.33-era ``main``). This deployment does not apply them, so a
request carrying one is refused by :func:`shared_prompt_reason`, which the completion rules
(:mod:`tokenkeys.preprocess.completion`) and the chat rules
(:func:`tokenkeys.preprocess.chat.unsupported_reason`) both consult: a count is never reported
for a prompt that generation would build differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenkeys.errors import InvalidArgument

# field -> why it cannot be honoured exactly; a null (or absent) value is always accepted.
_PROMPT_FIELDS: Mapping[str, str] = {
    "truncate_prompt_tokens": (
        "truncate_prompt_tokens is not supported: this deployment never truncates prompts, so "
        "the tokens would not be the engine's; shorten the prompt instead"
    ),
    "prompt_embeds": (
        "prompt_embeds is not supported: this deployment takes text or token ids, not "
        "embeddings; send prompt text or token ids"
    ),
    "multi_modal_data": (
        "multi_modal_data is not supported: this deployment runs no multimodal processor; "
        "send text only"
    ),
}


def shared_prompt_reason(request: Mapping[str, Any]) -> str | None:
    """Why a prompt-changing field of ``request`` cannot be honoured, or None when none is set."""
    for name, reason in _PROMPT_FIELDS.items():
        if request.get(name) is not None:
            return reason
    return None


def optional_flag(request: Mapping[str, Any], name: str) -> bool | None:
    """A boolean request field, None when absent or null; anything else is InvalidArgument."""
    value = request.get(name)
    if value is None or isinstance(value, bool):
        return value
    raise InvalidArgument(f"{name} must be true or false, got {value!r}", field=name)
