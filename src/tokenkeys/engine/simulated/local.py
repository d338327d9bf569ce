"""One served model's simulated engine, as the serving layers call it.

:class:`LocalEngine` is a served model's ``engine`` (an
:class:`~tokenkeys.engine.protocol.Engine`) when generation is simulated: the
:class:`~tokenkeys.engine.simulated.engine.SimulatedEngine` bound to the model's cache-key spec, its
:class:`~tokenkeys.events.stream.EventStream`, and the per-request resolution every caller
(gRPC ``Inference.Generate``, the HTTP routes) needs: the adapter's registered path and id, the
server's default seed, the model name where the profile keys it, the KV-cache group.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence

from tokenkeys.engine.config import SimulatedConfig
from tokenkeys.engine.hosting import EngineInputs
from tokenkeys.engine.protocol import EngineLoad, GenerateOutput, GenerationParams
from tokenkeys.engine.registry import EngineKind
from tokenkeys.engine.simulated.engine import SimulatedEngine
from tokenkeys.engine.simulated.event_extra_keys import VllmEventExtraKeys
from tokenkeys.errors import ConfigError, FailedPrecondition, InvalidArgument, NotFound
from tokenkeys.events.model import SpecRef
from tokenkeys.events.stream import EventStream
from tokenkeys.keys import Adapter, BlockKey, CacheKeySpec, KeyContext, KeyGroup
from tokenkeys.keys.memo import ChainMemo
from tokenkeys.keys.spec import SLIDING_WINDOW
from tokenkeys.tokenizer import Tokenizer

#: Block keys the key memo remembers per KV block of the engine.
MEMO_BLOCKS_PER_KV_BLOCK = 4


def simulated_groups(spec: CacheKeySpec) -> tuple[KeyGroup, list[tuple[int, int]]]:
    """The group the simulated engine keeps (the first that is not a sliding window) and the
    sliding windows beside it, as (index, window); ConfigError for a layout it cannot run."""
    full = [g for g in spec.groups if g.kind != SLIDING_WINDOW]
    if not full:
        raise ConfigError(
            "the simulated engine needs a group that is not a sliding window (--kv-groups)",
            field="kv_groups",
        )
    windows = [g for g in spec.groups if g.kind == SLIDING_WINDOW]
    for window in windows:
        if window.block_size != full[0].block_size:
            raise ConfigError(
                f"the simulated engine runs sliding-window groups of its full-attention group's "
                f"block size ({full[0].block_size}); group {window.index} has "
                f"{window.block_size}",
                field="kv_groups",
            )
    return full[0], [(w.index, w.sliding_window or 0) for w in windows]


def output_vocab(tokenizer: Tokenizer) -> list[int]:
    """Ids the simulated engine draws output from: the vocabulary without special tokens."""
    special = {a.id for a in tokenizer.specials.added if a.special}
    return [i for i in range(tokenizer.vocab_size) if i not in special]


class LocalEngine:
    """The simulated engine of one served model, with request resolution; see the module doc.

    ``generate`` has :meth:`Engine.generate`'s signature. ``context`` is a
    :class:`~tokenkeys.keys.KeyContext` (or None); an adapter is named by ``lora_name`` or
    ``context.adapter.name`` and must be registered (``--lora-modules``): its registered path
    and id are filled in, as vLLM hashes and reports them.
    """

    def __init__(
        self,
        name: str,
        tokenizer: Tokenizer,
        spec: CacheKeySpec,
        stream: EventStream,
        config: SimulatedConfig,
        *,
        max_model_len: int | None = None,
    ) -> None:
        self.model_name = name
        self.spec = spec
        self.stream = stream
        self.config = config
        group, windows = simulated_groups(spec)
        # The engine simulates the first full-attention group (and a hybrid model's sliding
        # windows beside it); its keys are the spec's keys at that group's block size (vLLM >=
        # 0.24 BlockHashListWithBlockSize), selected by group index.
        self._group = group.index if group.block_size != spec.hash_unit else None
        # Chains of earlier prompts, so a long mostly-seen prompt hashes only its new blocks;
        # bounded at a few times the KV capacity (keys beyond it rarely hit the engine again).
        self._memo = ChainMemo(spec, max_entries=MEMO_BLOCKS_PER_KV_BLOCK * config.num_kv_blocks)
        self.engine = SimulatedEngine(
            key_fn=self._keys,
            block_size=group.block_size,
            num_blocks=config.num_kv_blocks,
            event_sink=stream,
            latency=config.latency,
            output_vocab=output_vocab(tokenizer),
            max_model_len=max_model_len or tokenizer.specials.model_max_length,
            default_max_tokens=config.default_max_tokens,
            event_extra_keys=VllmEventExtraKeys(spec.hash_unit),
            group_idx=group.index,
            kv_cache_spec_kind=group.kind,
            windows=windows,
        )

    async def start(self) -> None:
        """Nothing to connect to: the simulated engine runs in this process."""

    async def ensure_up(self) -> None:
        """Always up while the process is."""

    def describe(self) -> str:
        """The kind, for the server log."""
        return "simulated"

    @property
    def block_size(self) -> int:
        """The simulated engine's KV block size."""
        return self.engine.block_size

    @property
    def num_blocks(self) -> int:
        """The simulated engine's KV blocks."""
        return self.engine.num_blocks

    @property
    def keys_verified(self) -> bool:
        """Always: the simulated engine hashes with the spec itself."""
        return True

    @property
    def takes_media(self) -> bool:
        """Always: image items are keys (identifier, placeholder run); nothing reads pixels."""
        return True

    @property
    def max_model_len(self) -> int | None:
        """``--max-model-len``, else the tokenizer's ``model_max_length``."""
        return self.engine.max_model_len

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """The adapters registered with ``--lora-modules``, by name and path."""
        return tuple(Adapter(m.name, m.path) for m in self.config.lora_modules)

    async def load(self) -> EngineLoad:
        """The simulated engine's requests and KV blocks."""
        return await self.engine.load()

    async def reset_prefix_cache(self) -> bool:
        """Empty the simulated cache (False while requests hold blocks); emits
        ``AllBlocksCleared`` on the event stream, as vLLM does."""
        return self.engine.reset_prefix_cache()

    async def close(self) -> None:
        """End the KV-event subscriptions (terminal message); the publisher is the runtime's."""
        self.stream.close()

    @property
    def spec_ref(self) -> SpecRef:
        """Profile and spec fingerprint the events of this engine follow."""
        return SpecRef(self.spec.profile_id, self.spec.fingerprint)

    def _keys(self, tokens: Sequence[int], context: KeyContext | None) -> list[BlockKey]:
        return self._memo.block_keys(tokens, context)

    def resolve(
        self, context: KeyContext | None, lora_name: str | None, lora_id: int | None
    ) -> tuple[KeyContext, str | None, int | None]:
        """The key context the engine hashes with, and the adapter name and id events report."""
        ctx = context if context is not None else KeyContext()
        if not isinstance(ctx, KeyContext):
            raise InvalidArgument(
                f"context must be a tokenkeys.keys.KeyContext, got {type(ctx).__name__}",
                field="context",
            )
        changes: dict[str, object] = {}
        name = lora_name or (ctx.adapter.name if ctx.adapter is not None else None)
        if lora_name and ctx.adapter is not None and ctx.adapter.name != lora_name:
            raise InvalidArgument(
                f"lora_name {lora_name!r} and context adapter {ctx.adapter.name!r} disagree",
                field="lora_name",
            )
        if name:
            module = self.config.adapter(name)
            if module is None:
                known = [m.name for m in self.config.lora_modules]
                raise NotFound(
                    f"LoRA adapter {name!r} is not served by model {self.model_name!r}; "
                    f"served adapters: {known or 'none'} (register with --lora-modules NAME=PATH)",
                    field="lora_name",
                )
            if ctx.adapter is not None and ctx.adapter.path not in (None, module.path):
                raise FailedPrecondition(
                    f"adapter {name!r} is registered with path {module.path!r}, the request "
                    f"says {ctx.adapter.path!r}",
                    field="adapter.path",
                )
            if lora_id is not None and lora_id != module.lora_id:
                raise InvalidArgument(
                    f"lora_id {lora_id} does not match adapter {name!r} (id {module.lora_id})",
                    field="lora_id",
                )
            changes["adapter"] = Adapter(name, module.path)
            lora_id = module.lora_id
        if "model" in self.spec.required_context and ctx.model is None:
            changes["model"] = self.model_name
        if self._group is not None and ctx.group is None:
            changes["group"] = self._group
        if changes:
            ctx = dataclasses.replace(ctx, **changes)
        return ctx, name or None, lora_id

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: GenerationParams | None = None,
        context: KeyContext | None = None,
        *,
        request_id: str | None = None,
        lora_name: str | None = None,
        lora_id: int | None = None,
    ) -> AsyncIterator[GenerateOutput]:
        """Run one request; one output per generated token, usage and timing on the last."""
        params = params or GenerationParams()
        if params.seed is None:
            params = dataclasses.replace(params, seed=self.config.seed)
        ctx, name, lora_id = self.resolve(context, lora_name, lora_id)
        outputs = self.engine.generate(
            prompt_token_ids, params, ctx, request_id=request_id, lora_name=name, lora_id=lora_id
        )
        # aclosing: a caller that stops early (client gone) releases the request's KV blocks now.
        async with contextlib.aclosing(outputs) as stream:
            async for output in stream:
                yield output


def build(inputs: EngineInputs) -> LocalEngine:
    """The simulated engine of one served model (its events on ``inputs.stream``)."""
    config = inputs.config
    assert inputs.stream is not None and isinstance(config.engine, SimulatedConfig)
    return LocalEngine(
        inputs.name,
        inputs.tokenizer,
        inputs.spec,
        inputs.stream,
        config.engine,
        max_model_len=config.max_model_len,
    )


KIND = EngineKind("simulated", "streamed", build)
