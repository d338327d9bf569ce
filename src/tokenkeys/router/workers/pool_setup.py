"""Building a model's pool from the first worker serving it: pull the tokenizer, decide keys.

1. The tokenizer: :func:`tokenkeys.artifacts.pull_async` from the worker's tokenizer endpoint,
   pinned to the advertised fingerprint, so what loads here is byte for byte (and option for
   option) what the engine tokenizes with; a cached revision costs no transfer.
2. One :class:`~tokenkeys.preprocess.Preprocessor` on it: the same path the engine takes from a
   request to token ids, used for every request of the pool and for /tokenize.
3. The key strategy (``tokenkeys.client.strategy_from_server``): the spec is fetched, checked
   against the advertised spec fingerprint, its vectors run locally; local computation when they
   pass, the engine's ComputeCacheKeys otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tokenkeys.access.channel import PLAIN, ChannelSecurity
from tokenkeys.artifacts import ArtifactCache, PullSettings, pull_async
from tokenkeys.errors import FailedPrecondition, Unsupported
from tokenkeys.keys.strategy import KeyStrategy
from tokenkeys.limits import Limits
from tokenkeys.preprocess import Preprocessor
from tokenkeys.preprocess.images import ImageOptions
from tokenkeys.router.workers.discovery import ModelDescription
from tokenkeys.router.workers.pool import Pool

#: ``(tokenizer endpoint, model, advertised spec fingerprint) -> KeyStrategy`` (blocking).
StrategyFactory = Callable[[str, str, str], KeyStrategy]


def server_strategy(
    target: str, model: str, spec_fingerprint: str, *, security: ChannelSecurity = PLAIN
) -> KeyStrategy:
    """The key strategy of ``model`` at ``target``: local after its vectors pass, else remote."""
    from tokenkeys.client.keys import CacheKeyClient, strategy_from_server

    client = CacheKeyClient(target, model, security=security)
    return strategy_from_server(client, expected_fingerprint=spec_fingerprint)


@dataclass(frozen=True)
class PoolSettings:
    """How pools are built: the artifact cache, request limits, the event transport.

    ``security`` (TLS, bearer token) reaches the workers' tokenizer endpoints: the artifact pull
    (unless ``pull`` says otherwise) and the default key strategy's cache-key calls. ``images``
    are the image options of every pool whose tokenizer folder carries a multimodal processor
    (``serve``'s: where media may come from, limits, the engine's model id when given).
    """

    cache: ArtifactCache | str | os.PathLike[str] | None = None
    limits: Limits = field(default_factory=Limits)
    transport: str = "auto"
    pull: PullSettings | None = None
    strategy: StrategyFactory = server_strategy
    security: ChannelSecurity = PLAIN
    images: ImageOptions = field(default_factory=ImageOptions)


class _ChatRefusingPreprocessor(Preprocessor):
    """A Preprocessor for a model whose engine overrides the chat template server-side.

    The override's digest is part of the fingerprint but its text is not an artifact, so chat
    prompts rendered here would differ from the engine's: refused rather than approximated.
    """

    def tokenize_chat(self, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported(
            "the workers of this model render chat with a server-side --chat-template override "
            "that tokenizer artifacts do not carry, so this router cannot reproduce their chat "
            "prompts; send /v1/completions with the rendered prompt instead",
            field="messages",
        )


async def build_pool(address: str, model: ModelDescription, settings: PoolSettings) -> Pool:
    """The pool of ``model`` built from the worker at ``address``; FailedPrecondition if not."""
    if model.key_spec is None:
        raise FailedPrecondition(
            f"model {model.name!r} at {address} advertises no cache-key spec", field="key_spec"
        )
    if not model.artifacts_available:
        cache = settings.cache
        store = cache if isinstance(cache, ArtifactCache) else ArtifactCache(cache)
        if store.lookup(model.fingerprint) is None:
            raise FailedPrecondition(
                f"worker {address} does not serve the tokenizer artifacts of {model.name!r} "
                f"(fingerprint {model.fingerprint[:16]}...) and they are not in the cache; run "
                "`tokenkeys pull` against a server that has them",
                field="artifacts",
            )
    tokenizer = await pull_async(
        model.tokenizer_endpoint,
        model=model.name,
        fingerprint=model.fingerprint,
        cache=settings.cache,
        settings=settings.pull or PullSettings(security=settings.security),
    )
    chat_reproducible = tokenizer.options.chat_template_sha256 is None
    cls = Preprocessor if chat_reproducible else _ChatRefusingPreprocessor
    preprocessor = cls(tokenizer, settings.limits, model=model.name, images=settings.images)
    factory = settings.strategy
    if factory is server_strategy:
        factory = functools.partial(server_strategy, security=settings.security)
    strategy = await asyncio.to_thread(
        factory, model.tokenizer_endpoint, model.name, model.key_spec.spec_fingerprint
    )
    return Pool(
        model.name,
        model.key_spec,
        tokenizer,
        preprocessor,
        strategy,
        max_context_length=model.max_context_length,
        transport=settings.transport,
    )


def pool_factory(settings: PoolSettings) -> Callable[[str, ModelDescription], Awaitable[Pool]]:
    """The registry's ``pool_factory`` for ``settings``."""

    async def build(address: str, model: ModelDescription) -> Pool:
        return await build_pool(address, model, settings)

    return build
