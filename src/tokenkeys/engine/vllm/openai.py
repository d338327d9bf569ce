"""The sidecar's HTTP pass-through: an OpenAI request goes to vLLM whole, with tokenkeys' ids.

Every field of ``/v1/completions`` and ``/v1/chat/completions`` reaches vLLM 0.32 as the client
sent it (sampling, stop strings, ``n``, logprobs, structured output, tools, ``stream_options``,
``priority``, ...), and vLLM's answer goes back untouched, so each field has vLLM's meaning and
vLLM's defaults (``max_tokens`` absent: 16 for completions, the rest of the context for chat).
Only the prompt is replaced by the Preprocessor's ids, the served number:

- completions: ``prompt`` becomes the id lists (``add_special_tokens`` was applied by the
  Preprocessor and is dropped);
- chat: the ids go in ``kv_transfer_params.prompt_token_ids``, vLLM 0.32's token-in chat
  (``vllm/renderers/online_renderer.py`` ``_reused_prompt_token_ids``): vLLM skips templating
  and tokenization but still validates ``tool_choice``, adjusts the request for its tool and
  reasoning parsers and parses the output, so tool calls, reasoning and chat logprobs are
  vLLM's own. The messages and tools are sent along for that. A conversation with images goes
  without the ids: vLLM 0.32 renders one itself (it ignores ids beside non-text content) and
  fetches, hashes and expands its images, as tokenkeys' Preprocessor did (the sidecar's start
  probe and live check prove the keys: :mod:`~tokenkeys.engine.vllm.image_probe`).

What cannot pass exactly is refused by :func:`refusal` (501 naming the field). A stream is
vLLM's, event for event (its usage chunk, when the client asked for one, is also what the
sidecar's metrics count; asking for it on the client's behalf would change vLLM's other
chunks); ``return_prompt_text`` gets the Preprocessor's rendered prompt, which vLLM does not
have for a prompt given as ids.

gRPC ``Generate`` on the sidecar sends its ids to ``/v1/completions`` too
(:func:`completion_body`); image items are refused there (UNIMPLEMENTED naming ``media``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson

from tokenkeys.engine.passthrough import OpenAIAnswer, OpenAIRequest, Route
from tokenkeys.engine.protocol import GenerationParams, Usage
from tokenkeys.engine.vllm.client import VllmHttpClient
from tokenkeys.errors import Unsupported
from tokenkeys.keys import KeyContext

_PATHS: dict[Route, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
#: Routes whose prompt is a rendered conversation: its ids go in kv_transfer_params (vLLM's
#: Responses render reads them there too: ``OnlineRenderer.preprocess_chat``).
_RENDERED = ("chat", "messages", "responses")
#: Routes whose events go back as vLLM sent them (``event:`` and ``data:`` lines).
_NAMED_EVENTS = ("messages", "responses")
#: Request headers vLLM reads: the answer id ends in X-Request-Id.
_HEADERS = ("x-request-id",)


def _kv_transfer(route: Route) -> Callable[[Any], bool]:
    allowed = {"prompt_token_ids"} if route == "chat" else set()
    return lambda kv: kv is not None and (not isinstance(kv, Mapping) or bool(set(kv) - allowed))


# (route or None for both, field, is the value refused?, why)
_RULES: tuple[tuple[Route | None, str, Callable[[Any], bool], str], ...] = (
    (
        "chat",
        "echo",
        lambda v: v is True,
        "with echo set vLLM renders the messages itself and ignores the prompt ids the "
        "sidecar forwards, so the prompt would not be the one tokenkeys counted",
    ),
    (
        "chat",
        "kv_transfer_params",
        _kv_transfer("chat"),
        "the sidecar sends the prompt ids in kv_transfer_params.prompt_token_ids; KV transfer "
        "between engines is not set up through it",
    ),
    (
        "completions",
        "kv_transfer_params",
        _kv_transfer("completions"),
        "KV transfer between engines is not set up through the sidecar",
    ),
)


def refusal(body: Mapping[str, Any], route: Route) -> tuple[str, str] | None:
    """The first field the sidecar cannot pass to vLLM exactly, as (field, reason), or None."""
    # Messages and Responses requests are chat requests to vLLM once converted: the chat rules.
    family: Route = "chat" if route in ("messages", "responses") else route
    for only, name, refused, why in _RULES:
        if only in (None, family) and refused(body.get(name)):
            return name, f"{name}={body.get(name)!r} is not supported through the sidecar: {why}"
    if route == "completions" and body.get("echo") is True and _has_text(body.get("prompt")):
        return "echo", (
            "echo=True with a text prompt is not supported through the sidecar: vLLM echoes a "
            "prompt given as ids as their decode (special tokens included), not the text sent; "
            "send the prompt as token ids (POST /tokenize gives them) to echo it"
        )
    return None


def _has_text(prompt: Any) -> bool:
    return isinstance(prompt, str) or (
        isinstance(prompt, list) and any(isinstance(p, str) for p in prompt)
    )


def vllm_body(request: OpenAIRequest, model: str) -> dict[str, Any]:
    """The body vLLM gets: the client's, under vLLM's model name, with the Preprocessor's ids."""
    body = dict(request.body)
    body["model"] = model
    if request.route in _RENDERED:
        if request.context is not None and request.context.mm_items:
            # vLLM 0.32 renders a conversation with images itself (``_reused_prompt_token_ids``
            # ignores ids beside non-text content; the ids alone would lose the images): the
            # messages go as sent, and vLLM fetches, hashes and expands them as tokenkeys did.
            return body
        kv = dict(body.get("kv_transfer_params") or {})
        kv["prompt_token_ids"] = request.prompts[0]
        body["kv_transfer_params"] = kv
    elif body.get("prompt_embeds") is None:  # embeddings go as sent (their ids are zeros)
        body.pop("add_special_tokens", None)
        body["prompt"] = request.prompts[0] if len(request.prompts) == 1 else request.prompts
    return body


async def answer(client: VllmHttpClient, request: OpenAIRequest, model: str) -> OpenAIAnswer:
    """Forward ``request`` to vLLM; its answer, with its usage collected for the metrics."""
    body = vllm_body(request, model)
    headers = {k: v for k, v in request.headers.items() if k.lower() in _HEADERS}
    path = _PATHS[request.route]
    if not body.get("stream"):
        whole = await client.forward(path, body, headers)
        if whole.status != 200:
            return OpenAIAnswer(whole.status, whole.body)
        doc = orjson.loads(whole.body)
        if request.route == "messages":
            return OpenAIAnswer(200, whole.body, usage=_anthropic_usages(doc))
        if request.route == "responses":
            return OpenAIAnswer(200, whole.body, usage=_responses_usages(doc))
        result = OpenAIAnswer(200, whole.body, usage=_usages(doc))
        if _wants_prompt_text(request):
            doc["prompt_text"] = request.prompt_text
            result.body = orjson.dumps(doc)
        return result
    refused, lines = await client.forward_stream(path, body, headers)
    if refused is not None:
        return OpenAIAnswer(refused.status, refused.body)
    result = OpenAIAnswer(200)
    if request.route in _NAMED_EVENTS:
        result.events = _lines_as_sent(lines, result)
    else:
        result.events = _events(lines, request, result)
    return result


async def _lines_as_sent(lines: AsyncIterator[bytes], result: OpenAIAnswer) -> AsyncIterator[bytes]:
    """Named events (``event:`` and ``data:`` lines) exactly as vLLM sent them; the usage of a
    Responses stream is read from its ``response.completed`` event on the way."""
    async for line in lines:
        if line.startswith(b"data:") and b'"response.completed"' in line:
            result.usage.extend(_responses_usages(orjson.loads(line[5:]).get("response")))
        yield line + b"\n"


async def _events(
    lines: AsyncIterator[bytes], request: OpenAIRequest, result: OpenAIAnswer
) -> AsyncIterator[bytes]:
    """vLLM's events as it sent them (its usage collected on the way)."""
    text_due = _wants_prompt_text(request)
    async for line in lines:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data != b"[DONE]":
            chunk = orjson.loads(data)
            if isinstance(chunk, dict) and chunk.get("usage") and not chunk.get("choices"):
                result.usage.append(usage_of(chunk["usage"]))
            elif text_due and isinstance(chunk, dict) and chunk.get("choices"):
                chunk["prompt_text"] = request.prompt_text
                data = orjson.dumps(chunk)
                text_due = False
        yield b"data: " + data + b"\n\n"


def _wants_prompt_text(request: OpenAIRequest) -> bool:
    return request.body.get("return_prompt_text") is True and request.prompt_text is not None


def _usages(doc: Any) -> list[Usage]:
    usage = doc.get("usage") if isinstance(doc, dict) else None
    return [usage_of(usage)] if isinstance(usage, dict) else []


def _anthropic_usages(doc: Any) -> list[Usage]:
    """A Messages answer's usage: its prompt is input + cache creation + cache read tokens."""
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return []
    read = int(usage.get("cache_read_input_tokens") or 0)
    created = int(usage.get("cache_creation_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + read + created
    return [Usage(prompt, int(usage.get("output_tokens") or 0), read)]


def _responses_usages(doc: Any) -> list[Usage]:
    """A Responses answer's usage (input tokens, of which cached, and output tokens)."""
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return []
    details = usage.get("input_tokens_details") or {}
    return [
        Usage(
            int(usage.get("input_tokens") or 0),
            int(usage.get("output_tokens") or 0),
            int(details.get("cached_tokens") or 0),
        )
    ]


def usage_of(usage: Mapping[str, Any]) -> Usage:
    """A usage object of vLLM's OpenAI answers (cached_tokens with prompt-tokens details)."""
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        int(details.get("cached_tokens") or 0),
    )


def completion_body(
    prompt: list[int],
    params: GenerationParams,
    ctx: KeyContext,
    model: str,
    max_model_len: int | None,
) -> dict[str, Any]:
    """The ``/v1/completions`` body of one gRPC ``Generate`` (the sidecar's :meth:`generate`).

    A prompt with image items is refused (UNIMPLEMENTED naming ``media``): vLLM 0.32's
    completions take token ids without the images they were expanded from, and would key the
    image blocks as text; image chats reach vLLM as messages over the HTTP routes instead.
    """
    if ctx.mm_items:
        raise Unsupported(
            f"{len(ctx.mm_items)} media items: vLLM's completions take token ids without the "
            "images they were expanded from, so the sidecar's Generate cannot forward them; "
            "send the image chat to /v1/chat/completions",
            field="media",
        )
    body: dict[str, Any] = {"model": model, "prompt": prompt}
    body.update(params.sampling())
    if params.max_tokens is not None:
        body["max_tokens"] = params.max_tokens
    elif max_model_len is not None:
        # Unset: the rest of the context, as vLLM's chat does (its completions say 16).
        body["max_tokens"] = max_model_len - len(prompt)
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if ctx.cache_salt is not None:
        body["cache_salt"] = ctx.cache_salt
    return body
