"""A Generate request, validated for a served model: token ids, parameters, key context.

What the simulated engine cannot honour exactly is refused with UNIMPLEMENTED naming the field
(media other than image items over token ids, guided decoding, logprobs, several sequences,
stop strings, min_tokens, KV sessions, prefix-cache bypass); the sampling knobs (temperature ..
repetition_penalty) are carried to the engine: a real vLLM samples with them, the simulated
tokens do not depend on them. Image items (``MediaItem`` with ``uuid`` and ``placeholder``)
enter the key context, so the engine keys their blocks as vLLM does. The same refusals apply
when generation is forwarded to a remote engine, because the forwarding interface carries token
ids, cache salt, adapter and media items, and brings back tokens, usage and finish reasons only.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys.engine.proto import items_of
from tokenkeys.engine.protocol import SAMPLING_KNOBS, GenerationParams
from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.keys import KeyContext
from tokenkeys.serving.models import ServedModel


@dataclass(frozen=True)
class GenerateInputs:
    """A validated Generate request as the engine takes it."""

    request_id: str
    token_ids: list[int]
    params: GenerationParams
    context: KeyContext | None
    lora_name: str | None


def unsupported(what: str, field: str) -> Unsupported:
    """The UNIMPLEMENTED refusal of ``field`` (``what`` it asks for), for either Generate face:
    tokenkeys engines produce token ids, usage and finish reasons, nothing beside them."""
    return Unsupported(
        f"{what} is not supported by this tokenkeys engine (it produces token ids, usage and "
        f"finish reasons only); drop {field} from the request",
        field=field,
    )


def _refuse_unsupported(request: gen.GenerateRequest) -> None:
    if request.media and request.WhichOneof("input") != "token_ids":
        raise unsupported(
            f"media input ({len(request.media)} items) beside a text prompt (send the token "
            "ids with each item's placeholder run instead)",
            "media",
        )
    guide = request.guided.WhichOneof("guide") if request.HasField("guided") else None
    if guide is not None:
        raise unsupported(f"guided decoding ({guide})", f"guided.{guide}")
    resp = request.response
    for name in (
        "return_prompt_logprobs",
        "return_output_logprobs",
        "prompt_candidates",
        "output_candidates",
        "prompt_logprob_start",
    ):
        if resp.HasField(name) and (getattr(resp, name) is not False):
            raise unsupported("logprobs", f"response.{name}")
    sampling = request.sampling
    if sampling.HasField("num_sequences"):
        if sampling.num_sequences == 0:
            raise InvalidArgument(
                "sampling.num_sequences is 0; it must be at least 1 (or unset for 1)",
                field="sampling.num_sequences",
            )
        if sampling.num_sequences > 1:
            raise unsupported(
                f"num_sequences={sampling.num_sequences} (several outputs per request)",
                "sampling.num_sequences",
            )
    stopping = request.stopping
    if stopping.HasField("min_tokens") and stopping.min_tokens > 0:
        raise unsupported("min_tokens", "stopping.min_tokens")
    for cond in stopping.conditions:
        if cond.WhichOneof("condition") == "stop_text":
            raise unsupported("stop strings", "stopping.conditions.stop_text")
    if request.kv.HasField("session"):
        raise unsupported("KV sessions (disaggregated prefill/decode)", "kv.session")
    if request.kv.bypass_prefix_cache:
        raise unsupported("bypassing the prefix cache", "kv.bypass_prefix_cache")


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
    sampling = request.sampling
    params = GenerationParams(
        # unset: the engine's default (the simulated engine's setting, vLLM's own)
        max_tokens=stopping.max_tokens if stopping.HasField("max_tokens") else None,
        seed=sampling.seed if sampling.HasField("seed") else None,
        stop_token_ids=tuple(
            c.stop_token_id for c in stopping.conditions if c.WhichOneof("condition")
        ),
        **{k: getattr(sampling, k) for k in SAMPLING_KNOBS if sampling.HasField(k)},
    )
    salt = request.kv.cache_salt if request.kv.HasField("cache_salt") else None
    items = items_of(request.media, len(ids))
    context = KeyContext(cache_salt=salt, mm_items=items) if salt is not None or items else None
    return GenerateInputs(
        request_id=request.request_id or uuid.uuid4().hex,
        token_ids=ids,
        params=params,
        context=context,
        lora_name=request.lora_name or None,
    )
