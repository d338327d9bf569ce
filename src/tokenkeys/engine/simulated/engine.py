"""The simulated engine: runs requests through a paged prefix cache and reports KV events.

Step and event timing follow vLLM 0.33's v1 scheduler (`vllm/v1/core/sched/scheduler.py`,
`vllm/v1/core/kv_cache_manager.py`), one request at a time per step:

- Prefix hit: the longest run of cached full prompt blocks, capped so that at least one prompt
  token is computed (vLLM's ``max_cache_hit_length = num_tokens - 1``).
- Prefill step: allocate the blocks the prompt still needs (evictions emit ``BlockRemoved``),
  cache the prompt's full blocks (one ``BlockStored``), sample the first token.
- Decode steps: each feeds the previous output token; when that fills a block, the block is
  keyed over prompt + output tokens and stored (vLLM hashes ``all_token_ids``). The last sampled
  token never gets KV, so it never fills a block.
- One :class:`~tokenkeys.events.model.EventBatch` per step that produced events, handed to the
  event sink. On finish the request's blocks are freed tail first; nothing is emitted then.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from array import array
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from tokenkeys.engine.context_window import check_requested, fit
from tokenkeys.engine.protocol import (
    EngineLoad,
    GenerateOutput,
    GenerationParams,
    SimulatedTiming,
    Usage,
)
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.engine.simulated.paged_cache import Block, BlockKeyLike, PagedPrefixCache
from tokenkeys.engine.simulated.prompt_ids import checked_ids
from tokenkeys.engine.simulated.sampler import TokenSampler
from tokenkeys.engine.simulated.window_group import SimulatedWindow, resumable
from tokenkeys.errors import ConfigError, InvalidArgument, LimitExceeded
from tokenkeys.events.model import MEDIUM_GPU, EventBatch
from tokenkeys.keys import Adapter


class BlockKeyFn(Protocol):
    """Keys of every full block of ``token_ids`` under the request ``context``, in order.

    The serving code binds its spec, e.g.
    ``lambda tokens, ctx: tokenkeys.keys.block_keys(tokens, spec, ctx)``.
    """

    def __call__(self, token_ids: Sequence[int], context: Any) -> Sequence[BlockKeyLike]: ...


#: ``(context, start, end) -> event extra keys of block [start, end)`` (None for none), as vLLM
#: 0.31+ writes them into ``BlockStored.extra_keys`` (untagged: adapter name, (mm id, offset),
#: salt, embeds digest).
EventExtraKeysFn = Callable[[Any, int, int], "tuple[Any, ...] | None"]
#: Receives each step's events; :class:`tokenkeys.events.stream.EventStream` is one.
EventSink = Callable[[EventBatch], object]


@dataclass
class EngineStats:
    """Counters of the engine's work since start."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    event_batches: int = 0
    #: Requests admitted and not finished, and requests waiting for KV blocks (gauges).
    running: int = 0
    waiting: int = 0


class SimulatedEngine:
    """Simulated LLM engine with a paged prefix cache, deterministic tokens and KV events.

    ``key_fn`` computes block keys (the engine never hashes itself); ``block_size`` must be the
    block size those keys are for. ``num_blocks`` is the KV capacity, ``default_max_tokens`` the
    output budget of a request that sets none. ``event_sink`` gets one
    batch per step that produced events. All methods run on one event loop.
    """

    def __init__(
        self,
        *,
        key_fn: BlockKeyFn,
        block_size: int,
        num_blocks: int,
        event_sink: EventSink | None = None,
        latency: LatencyModel | None = None,
        output_vocab: Sequence[int] = range(1000),
        max_model_len: int | None = None,
        default_max_tokens: int = 16,
        event_extra_keys: EventExtraKeysFn | None = None,
        group_idx: int = 0,
        medium: str = MEDIUM_GPU,
        kv_cache_spec_kind: str = "full_attention",
        windows: Sequence[tuple[int, int]] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_model_len is not None and max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {max_model_len}")
        self.cache = PagedPrefixCache(
            num_blocks,
            block_size,
            group_idx=group_idx,
            medium=medium,
            kv_cache_spec_kind=kv_cache_spec_kind,
        )
        #: Sliding-window groups, by (group index, window): a hybrid model (``window_group``).
        self.windows = [SimulatedWindow(i, w, block_size, num_blocks, medium) for i, w in windows]
        self.block_size = block_size
        self.key_fn = key_fn
        self.event_sink = event_sink
        self.latency = latency or LatencyModel()
        self.sampler = TokenSampler(output_vocab)
        self.max_model_len = max_model_len
        self.default_max_tokens = default_max_tokens
        self.event_extra_keys = event_extra_keys
        self.clock = clock
        self.stats = EngineStats()
        self._reserved = 0
        self._space = asyncio.Condition()

    @property
    def num_blocks(self) -> int:
        """KV capacity in blocks."""
        return self.cache.num_blocks

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """None: the bare simulated engine hashes whatever adapter a request's context names."""
        return ()

    async def load(self) -> EngineLoad:
        """Requests running and waiting, and the KV blocks they hold (:attr:`used_blocks`)."""
        return EngineLoad(
            self.stats.running, self.stats.waiting, self.used_blocks, self.cache.num_blocks
        )

    async def close(self) -> None:
        """Nothing to release: the engine owns no socket (its event sink is the caller's)."""

    @property
    def used_blocks(self) -> int:
        """KV blocks held for running requests: referenced, or reserved for their decode.

        Cached blocks no request references are free (allocation may evict them), as in
        vLLM's ``BlockPool.get_usage``; a running request's blocks still to be filled are
        counted from admission, since admission already took them from what others may use.
        """
        return self.cache.num_blocks - self.cache.num_free_blocks + self._reserved

    def _flush(self) -> None:
        # vLLM's batches list the groups in index order; window groups come first in Gemma's.
        events = [e for w in self.windows for e in w.cache.take_events()]
        events += self.cache.take_events()
        if events and self.event_sink is not None:
            self.stats.event_batches += 1
            self.event_sink(EventBatch(self.clock(), tuple(events)))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block and emit AllBlocksCleared; False while requests run."""
        done = self.cache.reset()
        if done:
            for window in self.windows:
                window.cache.reset()
        self._flush()
        return done

    def _check(self, prompt: list[int], params: GenerationParams) -> tuple[GenerationParams, array]:
        """Refuse a bad request; its parameters with max_tokens fitted to the context, and the
        prompt as ``array('I')`` (what the key function and the sampler read)."""
        if len(prompt) == 0:
            raise InvalidArgument(
                "prompt_token_ids is empty; give at least one token", field="prompt_token_ids"
            )
        ids = checked_ids(prompt)
        if params.max_tokens is None:
            # The engine's default is no request's: only fitted to the context, never refused.
            params = replace(params, max_tokens=self.default_max_tokens)
        elif isinstance(params.max_tokens, bool) or not isinstance(params.max_tokens, int):
            raise InvalidArgument(
                f"max_tokens is {params.max_tokens!r}; it must be an integer >= 1",
                field="max_tokens",
            )
        else:
            # vLLM 0.32's context rule, the one the HTTP frontend applies (one copy, one wording).
            check_requested(params.max_tokens, "max_tokens", self.max_model_len)
        fitted = fit(len(prompt), params.max_tokens, self.max_model_len)
        return replace(params, max_tokens=fitted), ids

    async def _admit(
        self, keys: Sequence[BlockKeyLike], prompt_len: int, need: int
    ) -> tuple[list[Block], list[list[Block]]]:
        """Wait until the request's blocks fit; touch its prefix hits and reserve the rest."""
        bs = self.block_size
        if need > self.cache.num_blocks:
            raise LimitExceeded(
                f"request needs {need} KV blocks of {bs} tokens but the engine has "
                f"{self.cache.num_blocks}; shorten the prompt or lower max_tokens",
                field="max_tokens",
            )
        async with self._space:
            while True:
                hits = self.cache.match_prefix(keys[: (prompt_len - 1) // bs])
                hits, held = resumable(self.windows, keys, hits)
                taken_from_free = self.cache.count_free(hits)
                fresh = need - len(hits)
                if self.cache.num_free_blocks - taken_from_free - self._reserved >= fresh:
                    self.cache.touch(hits)
                    for window, blocks in zip(self.windows, held, strict=True):
                        window.cache.touch(blocks)
                    self._reserved += fresh
                    self.stats.running += 1
                    return hits, held
                self.stats.waiting += 1
                try:
                    await self._space.wait()
                finally:
                    self.stats.waiting -= 1

    async def _release(self, run: _Running) -> None:
        blocks, unused_reservation = run.blocks, run.reserved
        for window, held in zip(self.windows, run.window_blocks, strict=True):
            window.cache.free(list(reversed(held)))
        self.cache.free(list(reversed(blocks)))
        self._reserved -= unused_reservation
        self.stats.running -= 1
        async with self._space:
            self._space.notify_all()

    def _allocate(self, count: int) -> list[Block]:
        self._reserved -= count
        return self.cache.allocate(count)

    def _store(
        self,
        blocks: list[Block],
        keys: Sequence[BlockKeyLike],
        tokens: Sequence[int],
        first: int,
        stop: int,
        context: Any,
        lora_name: str | None,
        lora_id: int | None,
    ) -> None:
        """Cache blocks ``first..stop-1`` of the request (one BlockStored)."""
        if stop <= first:
            return
        extra = self._extra(context, first, stop)
        self.cache.cache_blocks(
            blocks[first:stop],
            keys[first:stop],
            tokens[first * self.block_size : stop * self.block_size],
            keys[first - 1] if first > 0 else None,
            lora_id=lora_id,
            lora_name=lora_name,
            extra_keys=extra,
        )

    def _extra(self, context: Any, first: int, stop: int) -> list | None:
        """The event extra keys of blocks ``first..stop-1`` (None without an extra-key rule)."""
        if self.event_extra_keys is None:
            return None
        bs = self.block_size
        return [self.event_extra_keys(context, i * bs, (i + 1) * bs) for i in range(first, stop)]

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: GenerationParams | None = None,
        context: Any = None,
        *,
        request_id: str | None = None,
        lora_name: str | None = None,
        lora_id: int | None = None,
    ) -> AsyncIterator[GenerateOutput]:
        """Run one request; yield one output per generated token, usage on the last.

        ``context`` goes to the key function unchanged (adapter, cache salt, ...);
        ``lora_name``/``lora_id`` are reported in BlockStored events as vLLM does. Steps:
        admission (prefix hit, KV blocks reserved), prefill, then a decode step per token.
        """
        params = params or GenerationParams()
        prompt = list(prompt_token_ids)
        params, ids = self._check(prompt, params)
        run = _Running(request_id or uuid.uuid4().hex, list(prompt), context, lora_name, lora_id)
        keys = list(self.key_fn(ids, context))
        # KV is computed for every token but the last sampled one.
        need = -(-(len(prompt) + params.max_tokens - 1) // self.block_size)
        hits, run.window_blocks = await self._admit(keys, len(prompt), need)
        run.blocks, run.reserved = list(hits), need - len(hits)
        try:
            ttft = await self._prefill(run, keys, len(hits))
            total = ttft
            rng = self.sampler.rng(ids, params.seed)
            while True:
                token = self.sampler.next_token(rng)
                run.tokens.append(token)
                run.outputs.append(token)
                finish_reason = _finish_reason(token, len(run.outputs), params)
                if finish_reason is not None:
                    break
                yield GenerateOutput(run.request_id, (token,))
                total += await self._decode(run)
            usage = Usage(len(prompt), len(run.outputs), len(hits) * self.block_size)
            self._count(usage)
            timing = SimulatedTiming(ttft, total)
            yield GenerateOutput(run.request_id, (token,), True, finish_reason, usage, timing)
        finally:
            await self._release(run)

    async def _prefill(self, run: _Running, keys: list[BlockKeyLike], hits: int) -> float:
        """Allocate the prompt's uncached blocks, cache its full ones, wait the TTFT."""
        bs = self.block_size
        prompt_len = len(run.tokens)
        fresh = -(-prompt_len // bs) - hits
        run.blocks += self._allocate(fresh)
        run.reserved -= fresh
        self._store(run.blocks, keys, run.tokens, hits, prompt_len // bs, run.context, *run.lora)
        for n, window in enumerate(self.windows):
            extra = self._extra(run.context, hits, prompt_len // bs)
            run.window_blocks[n] += window.store(
                keys,
                run.tokens,
                hits,
                prompt_len // bs,
                prompt_len,
                extra,
                run.lora_id,
                run.lora_name,
            )
        self._flush()
        ttft = self.latency.time_to_first_token(prompt_len - hits * bs)
        if self.latency.sleep:
            await asyncio.sleep(ttft)
        return ttft

    async def _decode(self, run: _Running) -> float:
        """Feed the last sampled token (position ``len(tokens) - 1``); the step's time."""
        bs = self.block_size
        computed = len(run.tokens)
        if (computed - 1) % bs == 0:
            run.blocks += self._allocate(1)
            run.reserved -= 1
        if computed % bs == 0:
            keys = list(self.key_fn(run.tokens, run.context))
            full = computed // bs
            self._store(run.blocks, keys, run.tokens, full - 1, full, run.context, *run.lora)
        self._flush()
        step = self.latency.inter_token()
        if self.latency.sleep:
            await asyncio.sleep(step)
        return step

    def _count(self, usage: Usage) -> None:
        self.stats.requests += 1
        self.stats.prompt_tokens += usage.prompt_tokens
        self.stats.cached_prompt_tokens += usage.cached_prompt_tokens
        self.stats.completion_tokens += usage.completion_tokens


@dataclass
class _Running:
    """One request while it runs: its tokens so far, its KV blocks and what is still reserved."""

    request_id: str
    tokens: list[int]
    context: Any
    lora_name: str | None
    lora_id: int | None
    outputs: list[int] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    reserved: int = 0
    window_blocks: list[list[Block]] = field(default_factory=list)

    @property
    def lora(self) -> tuple[str | None, int | None]:
        return self.lora_name, self.lora_id


def _finish_reason(token: int, generated: int, params: GenerationParams) -> str | None:
    if token in params.stop_token_ids:
        return "stop"
    if generated >= params.max_tokens:
        return "length"
    return None
