"""The generation routes in front of an engine that answers OpenAI requests itself.

When a model's engine is an :class:`~tokenkeys.engine.passthrough.OpenAIPassThrough` (a real
vLLM behind the sidecar), ``/v1/completions`` and ``/v1/chat/completions`` still open the
request (body, schema, vLLM's validators, model) and tokenize it with the model's one
Preprocessor, then hand the whole request and its ids to the engine and answer with what the
engine answered: its status, its body or its events. The engine's refusals come first (501
naming the field), then the Preprocessor's (prompt 400/413/501); everything after is the
engine's, vLLM's own 400s included.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tokenkeys.engine.passthrough import OpenAIAnswer, OpenAIPassThrough, OpenAIRequest, Route
from tokenkeys.errors import Unsupported
from tokenkeys.frontend.generation import key_context, with_images
from tokenkeys.frontend.opening import Opened


async def forward(
    request: Request,
    opened: Opened,
    engine: OpenAIPassThrough,
    route: Route,
    sent: Mapping[str, Any] | None = None,
) -> Response:
    """Answer one generation request with the engine's own answer; see the module doc.

    ``sent``: the body the engine gets when it is not ``opened.body`` (a Messages request goes
    as the client sent it; ``opened.body`` is its chat conversion, which the Preprocessor
    renders).
    """
    body, model = opened.body, opened.model
    sent = body if sent is None else sent
    refused = engine.refusal(sent, route)
    if refused is not None:
        raise Unsupported(refused[1], field=refused[0])
    context = key_context(body)
    if route == "completions" and body.get("prompt_embeds") is not None:
        # Embeddings, not text: the engine reads the tensor (its rows are the prompt's tokens).
        embedded, context = await opened.run(engine.embedded_prompt, body, context)
        ids, text = [embedded], None
    elif route == "completions":
        prompts = await opened.run(model.preprocessor.tokenize_completion, body)
        ids, text = [p.ids for p in prompts], None
    else:
        chat = await opened.run(model.preprocessor.tokenize_chat, body)
        ids, text = [chat.tokens.ids], chat.prompt
        # The engine keys image blocks with the items' identifiers and placeholder ranges.
        context = with_images(context, chat.features)
    answer = await engine.answer(
        OpenAIRequest(route, sent, ids, context, opened.lora, request.headers, text)
    )
    if answer.events is None:
        opened.state.metrics.record_generation(model.name, route, answer.usage)
        return Response(answer.body, status_code=answer.status, media_type="application/json")
    events = _recorded(answer, answer.events, opened, route)
    return StreamingResponse(events, media_type="text/event-stream")


async def _recorded(
    answer: OpenAIAnswer, events: AsyncIterator[bytes], opened: Opened, route: Route
) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield event
    finally:
        await events.aclose()  # type: ignore[attr-defined]  # an async generator
        opened.state.metrics.record_generation(opened.model.name, route, answer.usage)
