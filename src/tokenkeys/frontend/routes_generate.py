"""``/v1/completions`` and ``/v1/chat/completions``: Preprocessor → token ids → the model's engine.

Both routes take their prompt ids from the model's one Preprocessor (``tokenize_completion``,
``tokenize_chat``), the same calls /tokenize makes, and report the engine's usage; so
``usage.prompt_tokens`` is by construction what /tokenize counts. Order of checks: body shape
(400, with chat's message and tool checks), model (404; a LoRA adapter's name selects its base
model and the adapter), requested output over the context (400), generation options (501),
prompt (400/413/501), prompt over the context (400, :mod:`~tokenkeys.engine.context_window`),
engine (400/413). In front of an engine that answers OpenAI requests itself (a real vLLM),
the request goes to it whole after the Preprocessor (:mod:`~tokenkeys.frontend.passthrough`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tokenkeys.engine.passthrough import OpenAIPassThrough
from tokenkeys.engine.protocol import GenerateOutput, Usage
from tokenkeys.errors import TokenkeysError, Unsupported
from tokenkeys.frontend import passthrough, sampling
from tokenkeys.frontend.body import json_response
from tokenkeys.frontend.errors import error_of
from tokenkeys.frontend.generation import EngineCall, eos_ids, key_context, usage_body
from tokenkeys.frontend.openapi import add_body_route
from tokenkeys.frontend.opening import Opened, open_request
from tokenkeys.frontend.responses import ChatCompletionResponse, CompletionResponse
from tokenkeys.frontend.schemas import ChatCompletionRequest, CompletionRequest
from tokenkeys.frontend.shapes import ChatShape, CompletionShape
from tokenkeys.frontend.state import (
    AppState,
    engine_context,
    engine_of,
)
from tokenkeys.frontend.streaming import DONE, IncrementalText, sse
from tokenkeys.preprocess.chat_schema import check_chat_request
from tokenkeys.preprocess.completion import refuse_empty_prompt
from tokenkeys.serving.models import ServedModel

S = TypeVar("S", CompletionShape, ChatShape)


def decoder(model: ServedModel, skip_special_tokens: bool):  # noqa: ANN202 - a small closure
    def decode(ids: Sequence[int]) -> str:
        return model.preprocessor.detokenize(
            [ids], skip_special_tokens=skip_special_tokens, field_name="output"
        )[0]

    return decode


def _shape(
    kind: type[S],
    request: Request,
    body: dict[str, Any],
    name: str,
    options: sampling.Sampling,
    **extra: Any,
) -> S:
    """The answer shape of a request; its id ends in the id the client gave the request (the
    X-Request-Id header, else the body's request_id), as vLLM 0.32's ``_base_request_id``."""
    request_id = request.headers.get("x-request-id") or body.get("request_id")
    return kind(
        kind.PREFIX,
        name,
        options.include_usage,
        options.return_token_ids,
        request_id=request_id,
        **extra,
    )


def _record(state: AppState, model: ServedModel, route: str, usages: Sequence[Usage]) -> None:
    state.metrics.record_generation(model.name, route, usages)


def _call(  # noqa: ANN202
    state: AppState, model: ServedModel, body: dict[str, Any], lora: str | None, chat: bool
):
    """The engine call of a validated request, and how its answer is shaped.

    What vLLM refuses (400) is refused before what this deployment does not do (501), so a
    request gets vLLM's answer whenever vLLM would refuse it.
    """
    engine = engine_of(model)
    limit = engine_context(model)
    options = sampling.sampling_of(body, eos_ids(model), limit)
    refused = sampling.unsupported_option(body, chat=chat)
    if refused is not None:
        raise Unsupported(refused[1], field=refused[0])
    return EngineCall(engine, options.params, key_context(body), lora, limit), options


def chat_call(opened: Opened) -> tuple[EngineCall, sampling.Sampling]:
    """The engine call of an opened chat request (also a converted Messages request)."""
    return _call(opened.state, opened.model, opened.body, opened.lora, chat=True)


async def completions(request: Request) -> Response:
    """OpenAI completions; the prompt may be text(s) or token ids."""
    opened = await open_request(request, CompletionRequest, refuse_empty_prompt)
    state, body, model, lora = opened.state, opened.body, opened.model, opened.lora
    if isinstance(engine := engine_of(model), OpenAIPassThrough):
        return await passthrough.forward(request, opened, engine, "completions")
    call, options = _call(state, model, body, lora, chat=False)
    prompts = await opened.run(model.preprocessor.tokenize_completion, body)
    ids = [p.ids for p in prompts]
    call.check(ids)
    shape = _shape(CompletionShape, request, body, lora or model.name, options)
    if options.stream:
        return await _stream(state, model, call, ids, options, shape, "completions")
    done = await call.run_all(ids)
    _record(state, model, "completions", [g.usage for g in done])
    decode = decoder(model, options.skip_special_tokens)
    choices = [
        shape.whole_choice(i, decode(g.token_ids), g.finish_reason, g.token_ids, prompt)
        for i, (g, prompt) in enumerate(zip(done, ids, strict=True))
    ]
    return json_response(shape.whole(choices, usage_body([g.usage for g in done])))


async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, rendered by the model's chat prologue and template."""
    # vLLM's request validators run before the 501s of _call.
    opened = await open_request(request, ChatCompletionRequest, check_chat_request)
    state, body, model, lora = opened.state, opened.body, opened.model, opened.lora
    if isinstance(engine := engine_of(model), OpenAIPassThrough):
        return await passthrough.forward(request, opened, engine, "chat")
    call, options = _call(state, model, body, lora, chat=True)
    chat = await opened.run(model.preprocessor.tokenize_chat, body)
    ids = chat.tokens.ids
    call.check([ids], rendered=chat.prompt is not None)
    call = call.with_images(chat.features)
    shape = _shape(
        ChatShape,
        request,
        body,
        lora or model.name,
        options,
        prompt_text=chat.prompt,
        return_prompt_text=body.get("return_prompt_text") is True,
    )
    if options.stream:
        return await _stream(state, model, call, [ids], options, shape, "chat")
    (done,) = await call.run_all([ids])
    _record(state, model, "chat", [done.usage])
    text = decoder(model, options.skip_special_tokens)(done.token_ids)
    return json_response(
        shape.whole(text, done.finish_reason, usage_body([done.usage]), ids, done.token_ids)
    )


async def _stream(
    state: AppState,
    model: ServedModel,
    call: EngineCall,
    prompts: list[list[int]],
    options: sampling.Sampling,
    shape: CompletionShape | ChatShape,
    route: str,
) -> Response:
    # The first prompt is started before the 200 goes out, so a refused request (empty prompt,
    # over max_model_len) is answered with its own status; later prompts report in-stream.
    first = await call.start(prompts[0])

    async def events() -> AsyncIterator[bytes]:
        decode = decoder(model, options.skip_special_tokens)
        usages: list[Usage] = []
        try:
            for index, prompt in enumerate(prompts):
                stream, head = first if index == 0 else await call.start(prompt)
                try:
                    opening = shape.opening(index, prompt)
                    if opening is not None:
                        yield sse(opening)
                    # Completions send the prompt ids on the first chunk of each choice.
                    prompt_ids: list[int] | None = None if opening is not None else prompt
                    text = IncrementalText(decode)
                    out: GenerateOutput | None = head
                    while out is not None:
                        delta = text.push(out.token_ids)
                        ids = list(out.token_ids)
                        if out.finished:
                            delta += text.finish()
                            if out.usage is not None:
                                usages.append(out.usage)
                            yield sse(shape.chunk(index, delta, out.finish_reason, ids, prompt_ids))
                            break
                        if delta or options.return_token_ids:
                            yield sse(shape.chunk(index, delta, None, ids, prompt_ids))
                            prompt_ids = None
                        out = await anext(stream, None)
                finally:
                    await stream.aclose()  # type: ignore[attr-defined]  # an async generator
            if options.include_usage:
                yield sse(shape.usage_chunk(usage_body(usages)))
        except TokenkeysError as error:
            yield sse(error_of(error)[1])
        finally:
            _record(state, model, route, usages)
        yield DONE

    return StreamingResponse(events(), media_type="text/event-stream")


def add_routes(app: FastAPI) -> None:
    """Mount the two generation routes."""
    add_body_route(
        app,
        "/v1/completions",
        completions,
        CompletionRequest,
        summary="Complete prompts (text or token ids); stream with stream: true",
        response_model=CompletionResponse,
    )
    add_body_route(
        app,
        "/v1/chat/completions",
        chat_completions,
        ChatCompletionRequest,
        summary="Answer a conversation; stream with stream: true",
        response_model=ChatCompletionResponse,
    )
