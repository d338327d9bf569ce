"""Derender answers as vLLM 0.32's render server gives them, without a tool or reasoning parser.

vLLM 0.32 (``scale_out/derender/serving.py`` ``ServingDerender``, ``renderers/
online_derenderer.py`` ``OnlineDerenderer``) turns a token-out answer into an OpenAI one: every
choice's ids are detokenized incrementally after the prompt (``prompt_token_ids``, else the
answer's own), with the request's ``skip_special_tokens`` (default true); finish and stop
reasons are the engine's; usage is the caller's prompt count (0 without one) and the ids'
count. Answers are serialized as vLLM's pydantic models dump (every key, nulls included).

Without a parser configured vLLM derenders plain text, whatever ``tools`` the original request
carried; tokenkeys serves no parser, so it answers as such a server. The bounds are vLLM's
(``_validate_derender_bounds``): ``VLLM_MAX_N_SEQUENCES`` (16384) answers and choices, each id
list within the context.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from tokenkeys.derender.incremental import Window, advance, seed
from tokenkeys.derender.logprobs import Speller, chat_logprobs, completion_logprobs
from tokenkeys.derender.pieces import Pieces
from tokenkeys.derender.token_out import (
    GenerateChoice,
    GenerateChunk,
    GenerateResponse,
    StreamState,
)
from tokenkeys.errors import InvalidArgument, Unsupported

#: vLLM's ``VLLM_MAX_N_SEQUENCES`` default.
MAX_SEQUENCES = 16384
#: vLLM's ``ModelConfig.max_logprobs`` default.
MAX_LOGPROBS = 20


def check_bounds(answers: Sequence[GenerateResponse], max_model_len: int) -> None:
    """vLLM's resource bounds on derender payloads (400s in its words)."""
    if len(answers) > MAX_SEQUENCES:
        raise InvalidArgument(
            f"generate_responses count ({len(answers)}) exceeds server maximum "
            f"({MAX_SEQUENCES}). Set VLLM_MAX_N_SEQUENCES to increase this limit."
        )
    for answer in answers:
        if len(answer.choices) > MAX_SEQUENCES:
            raise InvalidArgument(
                f"choices count ({len(answer.choices)}) in response '{answer.request_id}' "
                f"exceeds server maximum ({MAX_SEQUENCES})."
            )
        for choice in answer.choices:
            if choice.token_ids and len(choice.token_ids) > max_model_len:
                raise InvalidArgument(
                    f"token_ids length ({len(choice.token_ids)}) in choice {choice.index} "
                    f"exceeds max_model_len ({max_model_len})."
                )
            content = choice.logprobs.content if choice.logprobs is not None else None
            if content and len(content) > max_model_len:
                raise InvalidArgument(
                    f"logprobs.content length ({len(content)}) in choice {choice.index} "
                    f"exceeds max_model_len ({max_model_len})."
                )
            for entry in content or ():
                if len(entry.top_logprobs) > MAX_LOGPROBS:
                    raise InvalidArgument(
                        f"top_logprobs count ({len(entry.top_logprobs)}) in choice "
                        f"{choice.index} exceeds max_logprobs ({MAX_LOGPROBS})."
                    )


def check_prompt_ids(prompts: Sequence[Sequence[int] | None], max_model_len: int) -> None:
    """Caller-given prompt ids within the context (vLLM's ``_validate_prompt_token_ids``)."""
    for ids in prompts:
        if ids is not None and len(ids) > max_model_len:
            raise InvalidArgument(
                f"prompt_token_ids length ({len(ids)}) exceeds max_model_len ({max_model_len}).",
                field="prompt_token_ids",
            )


def refuse_unrebuilt(answer: GenerateResponse | GenerateChunk) -> None:
    """501 for what an answer carries that is not rebuilt here (metrics, prompt logprobs),
    naming the field: vLLM normalizes them into its own models."""
    if answer.metrics is not None:
        raise Unsupported("derendering per-request metrics is not served here", field="metrics")
    given = getattr(answer, "prompt_logprobs", None) or []
    if any(entry is not None for entry in given):
        raise Unsupported("derendering prompt logprobs is not served here", field="prompt_logprobs")


def _skip(original: Mapping[str, Any] | None) -> bool:
    """``skip_special_tokens`` of the original request (vLLM's ``_decode_params``; the other
    flag, ``spaces_between_special_tokens``, does not change a tokenizers-library decode)."""
    return original is None or original.get("skip_special_tokens") is not False


def _chat_logprobs(
    speller: Speller, choice: GenerateChoice, context: Sequence[int] = ()
) -> dict[str, Any] | None:
    """A choice's logprobs spelled (:mod:`tokenkeys.derender.logprobs`), None without."""
    if choice.logprobs is None:
        return None
    return chat_logprobs(speller, choice.logprobs.model_dump(), context)


def _completion_logprobs(
    speller: Speller, choice: GenerateChoice, context: Sequence[int] = (), offset: int = 0
) -> dict[str, Any] | None:
    """The completion form of :func:`_chat_logprobs`."""
    chat = _chat_logprobs(speller, choice, context)
    return None if chat is None else completion_logprobs(chat, offset)


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _ids(choice: GenerateChoice, where: str) -> list[int]:
    if not choice.token_ids:
        raise InvalidArgument(f"choice {choice.index}{where} has empty or null token_ids")
    return choice.token_ids


def _prompt(
    given: Sequence[int] | None, answer: GenerateResponse | GenerateChunk
) -> Sequence[int] | None:
    """The prompt ids a decode starts after: the caller's, else the answer's own."""
    return given if given is not None else answer.prompt_token_ids


def _head(
    answer: GenerateResponse | GenerateChunk, kind: str, model: str, choices: list[Any]
) -> dict[str, Any]:
    """The keys every derendered answer opens with: the engine's request id (a random one
    without it, as vLLM's default), the object kind, the clock, the model, the choices."""
    request_id = answer.request_id if answer.request_id is not None else str(uuid.uuid4())
    return {
        "id": request_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }


def chat_answer(
    speller: Speller,
    answer: GenerateResponse,
    model: str,
    prompt_tokens: int | None,
    prompt_ids: Sequence[int] | None,
    chat_request: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A ``ChatCompletionResponse`` of a whole token-out answer."""
    skip, codec = _skip(chat_request), speller.codec
    start = seed(codec, _prompt(prompt_ids, answer), skip=skip)
    with_ids = chat_request is not None and chat_request.get("return_token_ids") is True
    choices = []
    for choice in answer.choices:
        text, _ = advance(codec, start, _ids(choice, ""), skip=skip)
        message = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        choices.append(
            {
                "index": choice.index,
                "message": message,
                "logprobs": _chat_logprobs(speller, choice),
                "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason,
                "token_ids": choice.token_ids if with_ids else None,
                "routed_experts": None,
            }
        )
    prompt = prompt_tokens if prompt_tokens is not None else 0
    completion = sum(len(c.token_ids or ()) for c in answer.choices)
    return {
        **_head(answer, "chat.completion", model, choices),
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _usage(prompt, completion),
        "prompt_logprobs": answer.prompt_logprobs,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": answer.kv_transfer_params,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion_answer(
    speller: Speller,
    answers: Sequence[GenerateResponse],
    model: str,
    prompt_tokens: Sequence[int] | None,
    prompt_ids: Sequence[Sequence[int] | None] | None,
    completion_request: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A ``CompletionResponse`` of one token-out answer per prompt."""
    skip, codec = _skip(completion_request), speller.codec
    counts = list(prompt_tokens) if prompt_tokens is not None else [0] * len(answers)
    seeds = list(prompt_ids) if prompt_ids is not None else [None] * len(answers)
    choices: list[dict[str, Any]] = []
    completion = 0
    for answer, given in zip(answers, seeds, strict=True):
        start = seed(codec, _prompt(given, answer), skip=skip)
        for choice in answer.choices:
            ids = _ids(choice, f" in response {answer.request_id}")
            text, _ = advance(codec, start, ids, skip=skip)
            choices.append(
                {
                    "index": len(choices),
                    "text": text,
                    "logprobs": _completion_logprobs(speller, choice),
                    "finish_reason": choice.finish_reason,
                    "stop_reason": choice.stop_reason,
                    "token_ids": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": None,
                    "routed_experts": None,
                }
            )
            completion += len(ids)
    first = answers[0]
    kv = first.kv_transfer_params
    if any(a.kv_transfer_params != kv for a in answers[1:]):
        kv = None  # vLLM: differing transfer parameters are not merged
    prompt = sum(counts)
    return {
        **_head(first, "text_completion", model, choices),
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _usage(prompt, completion),
        "kv_transfer_params": kv,
        "ec_transfer_params": None,
        "metrics": None,
    }


def _window(state: StreamState | None) -> Window | None:
    if state is None:
        return None
    return Window(tuple(state.prev_tokens), state.prefix_offset, state.read_offset)


def _stream_usage(chunk: GenerateChunk, prompt_tokens: int | None) -> dict[str, Any] | None:
    if chunk.usage is None:
        return None
    prompt = prompt_tokens if prompt_tokens is not None else (chunk.usage.get("prompt_tokens") or 0)
    return _usage(prompt, chunk.usage.get("completion_tokens") or 0)


def _stream_start(
    codec: Pieces,
    chunk: GenerateChunk,
    state: StreamState | None,
    prompt_ids: Sequence[int] | None,
    skip: bool,
) -> tuple[StreamState, Window]:
    """The state a chunk continues: the client's, else seeded from the prompt."""
    if len(chunk.choices) > 1:
        raise InvalidArgument("derender streams take at most one choice per chunk")
    if state is not None:
        return state, _window(state)  # type: ignore[return-value]
    window = seed(codec, _prompt(prompt_ids, chunk), skip=skip)
    return StreamState(
        prev_tokens=list(window.pieces), prefix_offset=window.prefix, read_offset=window.read
    ), window


def _with_window(state: StreamState, window: Window, **changes: Any) -> StreamState:
    return state.model_copy(
        update={
            "prev_tokens": list(window.pieces),
            "prefix_offset": window.prefix,
            "read_offset": window.read,
            **changes,
        }
    )


def _envelope(
    chunk: GenerateChunk,
    kind: str,
    model: str,
    choices: list[dict[str, Any]],
    prompt_tokens: int | None,
    state: StreamState,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """A derendered stream chunk (vLLM's key order) with the state after it."""
    body = {
        **_head(chunk, kind, model, choices),
        "usage": _stream_usage(chunk, prompt_tokens),
        "system_fingerprint": None,
        **extra,
        "metrics": None,
    }
    return {"chunk": body, "stream_state": state.model_dump()}


def stream_chunk(
    chat: bool,
    speller: Speller,
    chunk: GenerateChunk,
    state: StreamState | None,
    model: str,
    prompt_tokens: int | None,
    prompt_ids: Sequence[int] | None,
    original: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """One ``DerenderChatStreamResponse`` (``chat``) or ``DerenderCompletionStreamResponse``:
    the chunk and the state after it. ``original`` is the chat or completion request."""
    skip, codec = _skip(original), speller.codec
    state, window = _stream_start(codec, chunk, state, prompt_ids, skip)
    context, offset = state.logprob_context_token_ids, state.logprob_text_offset
    with_ids = chat and original is not None and original.get("return_token_ids") is True
    choices = []
    for choice in chunk.choices:
        ids = choice.token_ids or []
        text, window = advance(codec, window, ids, skip=skip)
        tail = (state.logprob_context_token_ids + ids)[-4:]
        ending = {"finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason}
        if chat:
            role = None if state.role_sent else "assistant"
            state = _with_window(state, window, role_sent=True, logprob_context_token_ids=tail)
            delta = {"role": role, "content": text or None, "reasoning": None}
            choices.append(
                {"index": choice.index, "delta": delta}
                | {"logprobs": _chat_logprobs(speller, choice, context), **ending}
                | {"token_ids": choice.token_ids if with_ids else None}
            )
        else:
            state = _with_window(
                state,
                window,
                logprob_context_token_ids=tail,
                logprob_text_offset=state.logprob_text_offset + len(text),
            )
            resolved = _completion_logprobs(speller, choice, context, offset)
            choices.append(
                {"index": choice.index, "text": text, "logprobs": resolved, **ending}
                | {"prompt_token_ids": None, "token_ids": None}
            )
    if chat:
        extra = {"prompt_token_ids": None, "prompt_text": None}
        return _envelope(
            chunk, "chat.completion.chunk", model, choices, prompt_tokens, state, extra
        )
    return _envelope(chunk, "text_completion", model, choices, prompt_tokens, state, {})
