"""Driving a model's engine for the generation routes: whole answers and token streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from tokenkeys.engine.core import GenerateOutput, GenerationParams
from tokenkeys.engine.usage import Usage
from tokenkeys.errors import TokenkeysError
from tokenkeys.keys import KeyContext
from tokenkeys.server.models import ServedModel


@dataclass(frozen=True)
class Generated:
    """One prompt's complete generation."""

    token_ids: list[int]
    finish_reason: str | None
    usage: Usage


def key_context(request: dict[str, Any]) -> KeyContext | None:
    """The cache-key context of a request: only ``cache_salt`` (vLLM's extension) sets one."""
    salt = request.get("cache_salt")
    if salt is None:
        return None
    return KeyContext(cache_salt=salt)  # validates the salt exactly as vLLM 0.33 does


def eos_ids(model: ServedModel) -> tuple[int, ...]:
    """Every EOS id of the model's tokenizer (tokenizer_config and generation_config)."""
    return tuple(ref.id for ref in model.tokenizer.specials.eos)


async def generate(
    engine: Any, prompt: Sequence[int], params: GenerationParams, context: KeyContext | None
) -> Generated:
    """Run one prompt to the end."""
    tokens: list[int] = []
    last: GenerateOutput | None = None
    async for out in engine.generate(list(prompt), params, context):
        tokens.extend(out.token_ids)
        last = out
    if last is None or last.usage is None:
        raise TokenkeysError("the engine ended a request without reporting usage")
    return Generated(tokens, last.finish_reason, last.usage)


async def generate_all(
    engine: Any,
    prompts: Sequence[Sequence[int]],
    params: GenerationParams,
    context: KeyContext | None,
) -> list[Generated]:
    """Run several prompts concurrently (one engine batch); the first failure cancels the rest."""
    if len(prompts) == 1:
        return [await generate(engine, prompts[0], params, context)]
    tasks = [asyncio.ensure_future(generate(engine, p, params, context)) for p in prompts]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def started(
    engine: Any, prompt: Sequence[int], params: GenerationParams, context: KeyContext | None
) -> tuple[AsyncIterator[GenerateOutput], GenerateOutput]:
    """Open a stream and wait for its first output, so that a refused request still gets its
    own HTTP status instead of an error inside a 200 stream."""
    stream = engine.generate(list(prompt), params, context)
    try:
        first = await stream.__anext__()
    except BaseException:
        await stream.aclose()
        raise
    return stream, first


def usage_body(usages: Sequence[Usage]) -> dict[str, Any]:
    """OpenAI ``usage`` summed over a request's prompts, with the cached prompt tokens."""
    prompt = sum(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(u.cached_prompt_tokens for u in usages)},
    }
