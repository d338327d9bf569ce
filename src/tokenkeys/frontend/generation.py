"""Driving a model's engine for the generation routes: whole answers and token streams."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from tokenkeys.engine.context_window import fit
from tokenkeys.engine.protocol import GenerateOutput, GenerationParams, Usage
from tokenkeys.errors import TokenkeysError
from tokenkeys.keys import KeyContext
from tokenkeys.preprocess.images import MMFeature
from tokenkeys.serving.models import ServedModel


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


def with_images(context: KeyContext | None, features: Sequence[MMFeature]) -> KeyContext | None:
    """``context`` with a prompt's image items (the engine keys blocks with them); unchanged
    without images. An item without its identifier (no model id given or adopted) is refused
    (FailedPrecondition naming ``model_id``): keys without the image's identity would give two
    different images the same blocks."""
    if not features:
        return context
    items = tuple(f.item() for f in features)
    return dataclasses.replace(context or KeyContext(), mm_items=items)


def eos_ids(model: ServedModel) -> tuple[int, ...]:
    """Every EOS id of the model's tokenizer (tokenizer_config and generation_config)."""
    return tuple(ref.id for ref in model.tokenizer.specials.eos)


@dataclass(frozen=True)
class EngineCall:
    """How one request's prompts run on its model's engine: parameters, key context, adapter.

    ``max_model_len`` is the engine's context length when it states one: each prompt's output
    budget is then fitted to it as vLLM fits it (:mod:`~tokenkeys.engine.context_window`).
    """

    engine: Any
    params: GenerationParams
    context: KeyContext | None = None
    lora_name: str | None = None
    max_model_len: int | None = None

    def check(self, prompts: Sequence[Sequence[int]], *, rendered: bool = True) -> None:
        """Refuse the request (400) when a prompt does not fit, before anything is generated.

        ``rendered`` False: token-in chat ids, refused with vLLM's message for those.
        """
        for prompt in prompts:
            fit(len(prompt), self.params.max_tokens, self.max_model_len, rendered=rendered)

    def open(self, prompt: Sequence[int]) -> AsyncIterator[GenerateOutput]:
        """The engine's output stream for one prompt."""
        budget = fit(len(prompt), self.params.max_tokens, self.max_model_len)
        params = dataclasses.replace(self.params, max_tokens=budget)
        if self.lora_name is None:
            return self.engine.generate(list(prompt), params, self.context)
        return self.engine.generate(list(prompt), params, self.context, lora_name=self.lora_name)

    def with_images(self, features: Sequence[MMFeature]) -> EngineCall:
        """This call keyed with a prompt's image items (the engine keys blocks with them).

        An item without its identifier (no model id given or adopted) is refused: keys without the
        image's identity would give two different images the same blocks.
        """
        if not features:
            return self
        return dataclasses.replace(self, context=with_images(self.context, features))

    async def run(self, prompt: Sequence[int]) -> Generated:
        """Run one prompt to the end."""
        tokens: list[int] = []
        last: GenerateOutput | None = None
        async for out in self.open(prompt):
            tokens.extend(out.token_ids)
            last = out
        if last is None or last.usage is None:
            raise TokenkeysError("the engine ended a request without reporting usage")
        return Generated(tokens, last.finish_reason, last.usage)

    async def run_all(self, prompts: Sequence[Sequence[int]]) -> list[Generated]:
        """Run prompts concurrently (one engine batch); the first failure cancels the rest."""
        if len(prompts) == 1:
            return [await self.run(prompts[0])]
        tasks = [asyncio.ensure_future(self.run(p)) for p in prompts]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def start(
        self, prompt: Sequence[int]
    ) -> tuple[AsyncIterator[GenerateOutput], GenerateOutput]:
        """Open a stream and wait for its first output, so that a refused request still gets
        its own HTTP status instead of an error inside a 200 stream."""
        stream = self.open(prompt)
        try:
            first = await stream.__anext__()
        except BaseException:
            await stream.aclose()  # type: ignore[attr-defined]  # an async generator
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


def cache_creation_tokens(usage: Usage, engine: Any) -> int:
    """vLLM's ``num_cache_creation_tokens`` (0.32): the prompt's tokens in the full blocks the
    engine holds after the prefill, less those it found cached (``PrefillStats.finalize``)."""
    block = getattr(engine, "block_size", None) or 0
    stored = (usage.prompt_tokens // block) * block if block else usage.cached_prompt_tokens
    return max(0, stored - usage.cached_prompt_tokens)
