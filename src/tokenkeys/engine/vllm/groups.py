"""The KV-cache groups of the vLLM a sidecar fronts, learned from vLLM's own events at start.

vLLM 0.32 keeps one KV-cache group per attention kind of the model (``kv_cache_utils``
``get_kv_cache_groups``; it logs "kv cache group sizes (32, 32)" for a Gemma 3) but says so on
no HTTP route: ``/metrics`` ``vllm:cache_config_info`` carries one ``block_size`` and
``sliding_window="None"`` for a Gemma 3, ``/server_info`` no groups, and
``EngineCore.get_kv_cache_group_metadata`` (group index, kind, block size, window) is an
in-process call. What vLLM does publish is each group's fields on every ``BlockStored``
(``group_idx``, ``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window``, ``block_size``; set by
``BlockPool._build_block_stored_event`` from ``KVCacheManager.kv_cache_event_metadata``).

So the sidecar asks: before it serves, it sends vLLM one probe prompt of random token ids
(:data:`PROBE_BLOCKS` full blocks and one token; never cached before, so every group stores it)
and reads the groups off the batch vLLM publishes for it: every attention group stores a block
of such a prompt in the same engine step, a full-attention group all of them and a sliding
window its last ones. The groups become the spec's (:func:`respec`). A layout this project
cannot describe refuses the start naming it: a kind other than full attention and sliding
window (Mamba, chunked local attention, ...), a window without its size, group indexes with a
gap (a group that stored nothing of the probe), or a block size that is not a multiple of the
hash unit. Events without group fields (vLLM before 0.22) leave the configured spec as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from tokenkeys.engine.config import VllmEngineConfig
from tokenkeys.engine.hosting import EngineInputs
from tokenkeys.engine.vllm.adopt import adopted_spec
from tokenkeys.engine.vllm.checks import check_vllm, wait_for_vllm
from tokenkeys.engine.vllm.client import VllmHttpClient
from tokenkeys.errors import ConfigError, TokenkeysError
from tokenkeys.events.model import BlockStored
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.events.zmq_subscriber import ZmqEventSubscriber
from tokenkeys.keys import CacheKeySpec, KeyGroup, make_spec
from tokenkeys.keys.spec import FULL_ATTENTION, SLIDING_WINDOW

log = logging.getLogger(__name__)

#: Full blocks of the probe prompt (plus one token, so the last block is full and not the last
#: token, which vLLM always recomputes).
PROBE_BLOCKS = 4
#: Seconds to wait for the probe's events once vLLM answered it.
PROBE_TIMEOUT = 30.0
KINDS = (FULL_ATTENTION, SLIDING_WINDOW)


def probe_prompt(vocab_size: int, block_size: int, rng: random.Random | None = None) -> list[int]:
    """Random token ids no request has sent before (so no block of it is cached yet)."""
    rng = rng or random.SystemRandom()
    return [rng.randrange(vocab_size) for _ in range(PROBE_BLOCKS * block_size + 1)]


def groups_of(events: list[BlockStored], hash_unit: int, where: str) -> tuple[KeyGroup, ...]:
    """The groups the probe's ``BlockStored`` events name, or ConfigError naming the layout."""
    seen: dict[int, KeyGroup] = {}
    for event in events:
        index = event.group_idx or 0
        kind = event.kv_cache_spec_kind or FULL_ATTENTION
        window = event.kv_cache_spec_sliding_window
        if kind not in KINDS:
            raise ConfigError(
                f"vLLM at {where} keeps KV-cache group {index} of kind {kind!r}; tokenkeys "
                f"describes {' and '.join(KINDS)} groups only, so its keys cannot be checked "
                "or routed",
                field="engine",
            )
        if kind == SLIDING_WINDOW and not window:
            raise ConfigError(
                f"vLLM at {where} publishes sliding_window group {index} without its window "
                "(kv_cache_spec_sliding_window)",
                field="engine",
            )
        if event.block_size % hash_unit:
            raise ConfigError(
                f"vLLM at {where} stores {event.block_size}-token blocks in group {index}, not "
                f"a multiple of --block-size {hash_unit}",
                field="block-size",
            )
        seen[index] = KeyGroup(
            index, event.block_size, kind, sliding_window=window if kind == SLIDING_WINDOW else None
        )
    if sorted(seen) != list(range(len(seen))):
        raise ConfigError(
            f"vLLM at {where} stored the probe prompt in KV-cache groups {sorted(seen)}: a "
            "group between them stored no block of it, a layout tokenkeys cannot describe",
            field="engine",
        )
    return tuple(seen[i] for i in range(len(seen)))


def respec(spec: CacheKeySpec, groups: tuple[KeyGroup, ...]) -> CacheKeySpec:
    """``spec`` with the engine's ``groups`` (the same profile, hash unit and root)."""
    derivation = spec.root_derivation
    return make_spec(
        spec.profile_id,
        spec.hash_unit,
        root_seed=derivation.removeprefix("seed:") if derivation.startswith("seed:") else None,
        root_hex=spec.root_hex if derivation == "explicit" else None,
        groups=list(groups),
        vectors=bool(spec.vectors),
    )


#: A probe whose events did not arrive within this many seconds is sent again, fresh.
PROBE_RESEND = 5.0

Probe = tuple[dict[str, Any], Callable[[BlockStored], bool]]


async def probe_stores(
    client: VllmHttpClient,
    config: VllmEngineConfig,
    fresh: Callable[[], Probe],
    wire_version: str,
    *,
    timeout: float = PROBE_TIMEOUT,
) -> list[BlockStored]:
    """Send vLLM a probe request (``fresh()``: its body, and which stores are its own); the
    ``BlockStored`` events of the first batch with any of a probe's own, or ConfigError when
    vLLM publishes none within ``timeout``.

    The subscriber catches up from vLLM's replay buffer once connected, so a batch published
    before the subscription took effect is not lost; a probe unanswered for
    :data:`PROBE_RESEND` seconds is still sent again with fresh content, never cached, so vLLM
    stores and publishes it anew (a safety net for a replay that failed or timed out).
    """
    # From the start of vLLM's buffer: nothing published before the subscription settled is
    # missed.
    subscriber = ZmqEventSubscriber(
        config.kv_events, replay_endpoint=config.kv_replay, topic=config.kv_topic, start_seq=0
    )
    codec = VllmMsgpackCodec(wire_version)
    await subscriber.start()
    ours: list[Callable[[BlockStored], bool]] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body, mine = fresh()
            ours.append(mine)
            async with contextlib.aclosing(client.complete(body)) as chunks:
                async for _ in chunks:
                    pass
            resend = min(deadline, time.monotonic() + PROBE_RESEND)
            while (left := resend - time.monotonic()) > 0:
                try:
                    delivery = await asyncio.wait_for(subscriber.recv(), left)
                except asyncio.TimeoutError:
                    break
                try:
                    batch = codec.decode(delivery.payload)
                except TokenkeysError:
                    continue
                for own in ours:
                    found = [e for e in batch.events if isinstance(e, BlockStored) and own(e)]
                    if found:
                        return found
        raise ConfigError(
            f"vLLM at {config.url} published no KV events for {len(ours)} probe prompts "
            f"within {timeout:.0f} s; check that --engine-kv-events names the endpoint of "
            "its --kv-events-config and that it runs with --enable-prefix-caching",
            field="engine-kv-events",
        )
    finally:
        await subscriber.close()


async def learn_groups(
    client: VllmHttpClient,
    config: VllmEngineConfig,
    model: str,
    vocab_size: int,
    hash_unit: int,
    wire_version: str,
    *,
    timeout: float = PROBE_TIMEOUT,
) -> tuple[KeyGroup, ...] | None:
    """The groups vLLM stores a probe prompt in (None: its events carry no group fields)."""

    def fresh() -> Probe:
        ids = probe_prompt(vocab_size, hash_unit)
        body = {"model": model, "prompt": ids, "max_tokens": 1}
        return (
            body,
            lambda e: (
                e.parent_block_hash is None
                and bool(e.token_ids)
                and list(e.token_ids) == ids[: len(e.token_ids)]
            ),
        )

    mine = await probe_stores(client, config, fresh, wire_version, timeout=timeout)
    if all(e.group_idx is None for e in mine):
        return None
    groups = groups_of(mine, hash_unit, config.url)
    log.info(
        "vLLM at %s keeps KV-cache groups %s", config.url, ", ".join(_describe(g) for g in groups)
    )
    return groups


def _describe(group: KeyGroup) -> str:
    window = f" of {group.sliding_window} tokens" if group.sliding_window else ""
    return f"{group.index} {group.kind}{window} ({group.block_size}-token blocks)"


async def learned_spec(inputs: EngineInputs) -> CacheKeySpec:
    """The spec of one served model with the groups of the vLLM in front of which it runs
    (``EngineKind.spec`` of the vLLM kind): vLLM checked first, then probed."""
    config, spec = inputs.config, inputs.spec
    vllm = config.engine
    assert isinstance(vllm, VllmEngineConfig)
    client = VllmHttpClient(vllm.url)
    try:
        # Waits for vLLM (--engine-wait) as the sidecar's own start checks do: this runs first.
        await wait_for_vllm(client, vllm.wait_s)
        if vllm.key_options is not None:
            cache = (await client.metrics()).cache_config
            spec = adopted_spec(spec, vllm.key_options, cache, await client.version())
        await check_vllm(
            client, inputs.name, inputs.tokenizer, spec, config.max_model_len, vllm.wait_s
        )
        groups = await learn_groups(
            client,
            vllm,
            inputs.name,
            inputs.tokenizer.vocab_size,
            spec.hash_unit,
            config.wire_version,
        )
    finally:
        await client.close()
    if groups is None or groups == spec.groups:
        return spec
    return respec(spec, groups)
