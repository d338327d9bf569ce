"""Conversions between OpenEngine ``Inference.Generate`` messages and the engine's values.

Both directions of the engine's side: the request a frontend forwards to a remote engine and
the outputs it reads back (:class:`~tokenkeys.engine.remote.RemoteEngine`), and the responses a
server streams (``server/grpc/inference.py``). Validating an incoming request for a served
model is the server's (``server/grpc/generate_inputs.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys.engine.protocol import GenerateOutput, GenerationParams, SimulatedTiming, Usage
from tokenkeys.errors import InvalidArgument, TokenkeysError, Unsupported
from tokenkeys.keys import KeyContext, MMItem

_FINISH = {"stop": gen.FINISH_REASON_STOP, "length": gen.FINISH_REASON_LENGTH}
_FINISH_NAMES = {v: k for k, v in _FINISH.items()}
_FINISH_NAMES[gen.FINISH_REASON_CANCELLED] = "cancelled"
#: Trailing metadata of Generate carrying the simulated timing of the request (microseconds).
TTFT_METADATA = "tokenkeys-simulated-ttft-us"
TOTAL_METADATA = "tokenkeys-simulated-total-us"


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
    if ctx.prompt_embeds_digests or ctx.parent is not None:
        raise Unsupported(
            "a remote engine receives token ids, cache salt, adapter name and media items "
            "only; prompt embeddings and chained parents cannot be forwarded",
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
    if params.max_tokens is not None:
        request.stopping.max_tokens = params.max_tokens
    request.stopping.conditions.extend(
        gen.StopCondition(stop_token_id=t) for t in params.stop_token_ids
    )
    if params.seed is not None:
        request.sampling.seed = params.seed
    for name, value in params.sampling().items():
        setattr(request.sampling, name, value)
    if ctx.cache_salt is not None:
        request.kv.cache_salt = ctx.cache_salt
    request.media.extend(media_of(ctx.mm_items))
    return request


def media_of(items: Sequence[MMItem]) -> list[gen.MediaItem]:
    """The Generate media of a context's items: an image each (the only modality the
    Preprocessor expands; video and audio are refused before an engine is asked), its
    identifier as ``uuid`` (vLLM keys a client's uuid in place of its own hash) and its
    placeholder run in the token ids (``MediaItem.placeholder``, tokenkeys' field 100)."""
    return [
        gen.MediaItem(
            modality=gen.MODALITY_IMAGE,
            uuid=item.identifier,
            placeholder=gen.MediaPlaceholder(offset=item.offset, length=item.length),
        )
        for item in items
    ]


def items_of(media: Sequence[gen.MediaItem], token_count: int) -> tuple[MMItem, ...]:
    """The key items of a Generate request's media over ``token_count`` given token ids.

    The inverse of :func:`media_of`. Refusals name the item's field: another modality
    (UNIMPLEMENTED), an item without its placeholder run (UNIMPLEMENTED: a tokenkeys engine
    does not expand media itself), an empty ``uuid``, a run outside the token ids, items out
    of order or overlapping (INVALID_ARGUMENT).
    """
    items = []
    for i, medium in enumerate(media):
        field = f"media[{i}]"
        if medium.modality != gen.MODALITY_IMAGE:
            name = gen.Modality.Name(medium.modality).removeprefix("MODALITY_").lower()
            raise Unsupported(
                f"{field}.modality is {name}; a tokenkeys engine keys image items only",
                field=f"{field}.modality",
            )
        if not medium.HasField("placeholder"):
            raise Unsupported(
                f"{field}.placeholder is unset; a tokenkeys engine does not expand media: "
                "send the expanded token ids and each item's placeholder (offset, length)",
                field=f"{field}.placeholder",
            )
        if not medium.uuid:
            raise InvalidArgument(
                f"{field}.uuid is empty; set it to the identifier the item's blocks are keyed "
                "with (vLLM: its mm hash, or the client's uuid)",
                field=f"{field}.uuid",
            )
        run = medium.placeholder
        if run.offset + run.length > token_count:
            raise InvalidArgument(
                f"{field}.placeholder spans tokens {run.offset}..{run.offset + run.length - 1}, "
                f"past the {token_count} token ids given",
                field=f"{field}.placeholder",
            )
        try:
            items.append(MMItem(medium.uuid, run.offset, run.length))
        except TokenkeysError as error:
            raise type(error)(
                f"{field}.placeholder: {error.message}", field=f"{field}.placeholder"
            ) from None
    for i in range(1, len(items)):
        if items[i].offset < items[i - 1].end:
            raise InvalidArgument(
                f"media[{i}].placeholder starts at token {items[i].offset}, before "
                f"media[{i - 1}] ends ({items[i - 1].end}); items must be sorted by offset and "
                "must not overlap",
                field=f"media[{i}].placeholder",
            )
    return tuple(items)


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
