"""How a generation request fits the model's context, as vLLM 0.32 decides it.

vLLM 0.32 (``vllm/renderers/params.py`` ``TokenizeParams``, ``vllm/entrypoints/serve/utils/
api_utils.py`` ``get_max_tokens``, ``vllm/sampling_params.py``) answers 400
``BadRequestError`` in three cases and otherwise shortens the output budget:

1. the requested output (``max_tokens``, or chat's ``max_completion_tokens`` when set) is larger
   than ``max_model_len`` (``param``: that field);
2. a prompt alone has more than ``max_model_len`` tokens (``param: "input_tokens"``);
3. a prompt fills the context exactly, leaving an output budget of 0 (``param: "max_tokens"``).

A token-in chat (ids in ``kv_transfer_params``, nothing rendered) skips the renderer's check, so
case 2 is then ``get_max_tokens``' own message, without a ``param``.

A prompt that fits with room to spare generates at most ``max_model_len - prompt`` tokens (the
answer then ends with ``finish_reason: "length"``): a prompt plus ``max_tokens`` over the context
is not an error in vLLM 0.32. The messages are vLLM's, so clients that match on them work.
A context length is only known when the model's engine states one; otherwise the engine judges.

This is the one copy of the rule: the HTTP frontend applies it before tokens are generated, and
the simulated engine (:class:`tokenkeys.engine.simulated.engine.SimulatedEngine`, behind gRPC
``Generate`` too) applies it to every request it runs, so both refuse with the same words and
the same class, :class:`~tokenkeys.errors.ContextLengthExceeded` (400, INVALID_ARGUMENT).
"""

from __future__ import annotations

from tokenkeys.errors import ContextLengthExceeded, InvalidArgument, vllm_invalid


def check_requested(max_tokens: int | None, field: str, limit: int | None) -> None:
    """Refuse an output budget larger than the whole context (case 1), before tokenizing."""
    if limit is not None and max_tokens is not None and max_tokens > limit:
        raise vllm_invalid(
            f"{field}={max_tokens} cannot be greater than max_model_len={limit}. "
            "Please request fewer output tokens.",
            field,
            max_tokens,
            kind=ContextLengthExceeded,
        )


def fit(
    prompt_len: int, max_tokens: int | None, limit: int | None, *, rendered: bool = True
) -> int | None:
    """The output budget of one prompt: ``max_tokens`` capped by the context left (cases 2, 3).

    ``rendered``: the prompt went through the renderer (False: a token-in chat's ids). Without a
    ``limit`` the budget is ``max_tokens``, still refused below 1 as vLLM's ``SamplingParams``
    refuses it, in the same words as case 3. ``max_tokens`` None (the engine's default) stays
    None once the prompt is known to fit with room for one token.
    """
    if limit is not None and prompt_len > limit and not rendered:
        raise ContextLengthExceeded(
            f"Input length ({prompt_len}) exceeds model's maximum context length ({limit})."
        )
    if limit is not None and prompt_len > limit:
        raise vllm_invalid(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {_at_least(prompt_len, limit)}{prompt_len} input tokens, which exceeds "
            "this limit even without any "
            "output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
            prompt_len,
            kind=ContextLengthExceeded,
        )
    if max_tokens is None:
        if limit is not None and prompt_len >= limit:
            fit(prompt_len, limit, limit, rendered=rendered)  # case 3, in its words
        return None
    budget = max_tokens if limit is None else min(max_tokens, limit - prompt_len)
    if budget < 1:
        raise vllm_invalid(
            f"max_tokens must be at least 1, got {budget}.",
            "max_tokens",
            budget,
            kind=ContextLengthExceeded if budget < max_tokens else InvalidArgument,
        )
    return budget


def _at_least(prompt_len: int, limit: int) -> str:
    # vLLM encodes text with truncation at limit + 1, so a count of exactly limit + 1 may hide a
    # longer prompt; its message then says "at least", for token prompts too (params.py, 0.32).
    return "at least " if prompt_len == limit + 1 else ""
