"""Conversions between OpenEngine ``Inference.Generate`` messages and the engine's values.

What the simulated engine cannot honour exactly is refused with UNIMPLEMENTED naming the field
(media, guided decoding, logprobs, several sequences, stop strings, min_tokens, KV sessions,
prefix-cache bypass); sampling knobs other than ``seed`` are accepted and have no effect on the
simulated tokens. The same refusals apply when generation is forwarded to a remote engine,
because the forwarding interface carries token ids, usage and finish reasons only.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys.engine.core import GenerateOutput, GenerationParams
from tokenkeys.engine.usage import SimulatedTiming, Usage
from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.keys import KeyContext
from tokenkeys.serving.models import ServedModel

#: max_tokens when a request leaves it unset (vLLM's completions default).
DEFAULT_MAX_TOKENS = 16

_FINISH = {"stop": gen.FINISH_REASON_STOP, "length": gen.FINISH_REASON_LENGTH}
_FINISH_NAMES = {v: k for k, v in _FINISH.items()}
_FINISH_NAMES[gen.FINISH_REASON_CANCELLED] = "cancelled"
#: Trailing metadata of Generate carrying the simulated timing of the request (microseconds).
TTFT_METADATA = "tokenkeys-simulated-ttft-us"
TOTAL_METADATA = "tokenkeys-simulated-total-us"


@dataclass(frozen=True)
class GenerateInputs:
    """A validated Generate request as the engine takes it."""

    request_id: str
    token_ids: list[int]
    params: GenerationParams
    context: KeyContext | None
    lora_name: str | None


def _unsupported(what: str, field: str) -> Unsupported:
    return Unsupported(
        f"{what} is not supported by this engine (tokenkeys' simulated engine produces token "
        f"ids, usage and finish reasons only); drop {field} from the request",
        field=field,
    )


def _refuse_unsupported(request: gen.GenerateRequest) -> None:
    if request.media:
        raise _unsupported(f"media input ({len(request.media)} items)", "media")
    guide = request.guided.WhichOneof("guide") if request.HasField("guided") else None
    if guide is not None:
        raise _unsupported(f"guided decoding ({guide})", f"guided.{guide}")
    resp = request.response
    for name in (
        "return_prompt_logprobs",
        "return_output_logprobs",
        "prompt_candidates",
        "output_candidates",
        "prompt_logprob_start",
    ):
        if resp.HasField(name) and (getattr(resp, name) is not False):
            raise _unsupported("logprobs", f"response.{name}")
    sampling = request.sampling
    if sampling.HasField("num_sequences"):
        if sampling.num_sequences == 0:
            raise InvalidArgument(
                "sampling.num_sequences is 0; it must be at least 1 (or unset for 1)",
                field="sampling.num_sequences",
            )
        if sampling.num_sequences > 1:
            raise _unsupported(
                f"num_sequences={sampling.num_sequences} (several outputs per request)",
                "sampling.num_sequences",
            )
    stopping = request.stopping
    if stopping.HasField("min_tokens") and stopping.min_tokens > 0:
        raise _unsupported("min_tokens", "stopping.min_tokens")
    for cond in stopping.conditions:
        if cond.WhichOneof("condition") == "stop_text":
            raise _unsupported("stop strings", "stopping.conditions.stop_text")
    if request.kv.HasField("session"):
        raise _unsupported("KV sessions (disaggregated prefill/decode)", "kv.session")
    if request.kv.bypass_prefix_cache:
        raise _unsupported("bypassing the prefix cache", "kv.bypass_prefix_cache")


def generate_inputs(request: gen.GenerateRequest, model: ServedModel) -> GenerateInputs:
    """Validate ``request`` for ``model``: text is tokenized by the model's Preprocessor."""
    _refuse_unsupported(request)
    kind = request.WhichOneof("input")
    if kind == "prompt":
        ids = model.preprocessor.tokenize_prompts([request.prompt], field_name="prompt")[0].ids
    elif kind == "token_ids":
        ids = list(request.token_ids.ids)
        model.preprocessor.limits.check_tokens("token_ids", len(ids))
        model.tokenizer.check_ids([ids], field="token_ids")
    else:
        raise InvalidArgument(
            "GenerateRequest has no input; set prompt (text) or token_ids", field="input"
        )
    stopping = request.stopping
    max_tokens = stopping.max_tokens if stopping.HasField("max_tokens") else DEFAULT_MAX_TOKENS
    params = GenerationParams(
        max_tokens=max_tokens,
        seed=request.sampling.seed if request.sampling.HasField("seed") else None,
        stop_token_ids=tuple(
            c.stop_token_id for c in stopping.conditions if c.WhichOneof("condition")
        ),
    )
    salt = request.kv.cache_salt if request.kv.HasField("cache_salt") else None
    context = KeyContext(cache_salt=salt) if salt is not None else None
    return GenerateInputs(
        request_id=request.request_id or uuid.uuid4().hex,
        token_ids=ids,
        params=params,
        context=context,
        lora_name=request.lora_name or None,
    )


def generate_request(
    model: str,
    token_ids: list[int],
    params: GenerationParams,
    context: KeyContext | None,
    request_id: str | None,
    lora_name: str | None,
) -> gen.GenerateRequest:
    """The request a frontend forwards to a remote engine: token ids, never text."""
    ctx = context or KeyContext()
    if ctx.mm_items or ctx.prompt_embeds_digests or ctx.parent is not None:
        raise Unsupported(
            "a remote engine receives token ids, cache salt and adapter name only; multimodal "
            "items, prompt embeddings and chained parents cannot be forwarded",
            field="context",
        )
    adapter = ctx.adapter.name if ctx.adapter is not None else None
    if lora_name and adapter and lora_name != adapter:
        raise InvalidArgument(
            f"lora_name {lora_name!r} and context adapter {adapter!r} disagree", field="lora_name"
        )
    request = gen.GenerateRequest(
        request_id=request_id or "",
        model=model,
        token_ids=gen.TokenIds(ids=token_ids),
        lora_name=lora_name or adapter or "",
    )
    request.stopping.max_tokens = params.max_tokens
    request.stopping.conditions.extend(
        gen.StopCondition(stop_token_id=t) for t in params.stop_token_ids
    )
    if params.seed is not None:
        request.sampling.seed = params.seed
    if ctx.cache_salt is not None:
        request.kv.cache_salt = ctx.cache_salt
    return request


def token_response(request_id: str, output: GenerateOutput) -> gen.GenerateResponse:
    """One streamed token (output index 0)."""
    return gen.GenerateResponse(
        request_id=request_id,
        token=gen.TokenOutput(
            output_index=0, tokens=[gen.TokenInfo(token_id=t) for t in output.token_ids]
        ),
    )


def finished_response(request_id: str, output: GenerateOutput) -> gen.GenerateResponse:
    """The last message: GenerationFinished with the finish reason, and usage."""
    reason = _FINISH.get(output.finish_reason or "", gen.FINISH_REASON_UNSPECIFIED)
    finished = gen.GenerationFinished(output_index=0, reason=reason)
    if reason == gen.FINISH_REASON_STOP and output.token_ids:
        finished.stop_match.stop_token_id = output.token_ids[-1]
    response = gen.GenerateResponse(request_id=request_id, finished=finished)
    usage = output.usage
    if usage is not None:
        response.usage.CopyFrom(
            gen.Usage(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                total_tokens=usage.total_tokens,
                cached_prompt_tokens=usage.cached_prompt_tokens,
            )
        )
    return response


def timing_metadata(timing: SimulatedTiming | None) -> tuple[tuple[str, str], ...]:
    """Trailing metadata with the simulated time to first token and total time."""
    if timing is None:
        return ()
    return (
        (TTFT_METADATA, str(round(timing.ttft_s * 1e6))),
        (TOTAL_METADATA, str(round(timing.total_s * 1e6))),
    )


def timing_from_metadata(metadata: object) -> SimulatedTiming | None:
    """Inverse of :func:`timing_metadata` (None when the engine sent none)."""
    items = dict(metadata or ())  # type: ignore[call-overload]
    try:
        return SimulatedTiming(int(items[TTFT_METADATA]) / 1e6, int(items[TOTAL_METADATA]) / 1e6)
    except (KeyError, ValueError):
        return None


def finish_of(message: gen.GenerationFinished) -> str | None:
    """The engine's finish reason name for a GenerationFinished."""
    return _FINISH_NAMES.get(message.reason)


def usage_of(message: gen.GenerateResponse) -> Usage | None:
    """The usage of the last message, if it carries one."""
    if not message.HasField("usage"):
        return None
    u = message.usage
    return Usage(u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens)
