"""Acceptance: smg 1.13 routing over two real vLLMs behind tokenkeys sidecars, by gRPC.

Two vLLM 0.32 servers (the harness's engine options, each its own process) and one
``tokenkeys serve --vllm-engine-face`` sidecar in front of each: smg registers the sidecars as
gRPC vLLM workers, tokenizes with the tokenizer from their ``GetTokenizer``, and its
``cache_aware`` policy indexes the KV events the sidecars relay from vLLM. The same workload
(conversations sharing a few long system prompts, turns in a seeded random order) goes through
smg's ``cache_aware`` and through its ``round_robin``, each run opening with its own number (so
neither finds the other's prompts, nor an earlier test's, in the engines' caches); the
hits are vLLM's own ``cached_tokens``. cache_aware must serve at least 1.5 times as many prompt
tokens from cache as round robin.

The workload is the one a router exists for: every conversation opens with a document of its
own and each turn adds a long question, so a turn's cached prefix is its conversation's last
turn, held by one engine. An odd number of conversations sent in a fixed order makes round robin
alternate each conversation between the engines (it finds only the turn before last there);
cache_aware follows the events to the engine that holds the last turn. Each request waits until
smg has applied every batch the sidecars relayed (``smg_kv_event_batches_total``), as a user
thinks for seconds and events take milliseconds; nothing is timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from evidence import unavailable
from smg_gateway import SmgRouter, chat, smg_executable, smg_router

from served_pair import TokenkeysServe, sidecar_args
from smg_stubs import require_smg_stubs
from vllm_server import DEFAULT_CONFIG, MODEL_NAME

require_smg_stubs()

pytestmark = [
    pytest.mark.realengine,
    pytest.mark.vllm_servers(DEFAULT_CONFIG, DEFAULT_CONFIG.second()),
]

CONVERSATIONS = 5
TURNS = 4
WAIT_LIMIT_S = 120.0  # a guard against a wedged gateway, never a criterion


def document(n: int, run: int) -> str:
    # Each run opens with its own number: no run finds the other's prompts in the caches.
    facts = " ".join(
        f"Fact {f} of file {n}: item {n * 31 + f} weighs {f + 2} kg." for f in range(8)
    )
    return f"Run {run}. Conversation {n} is about this file. {facts}"


def question(n: int, turn: int) -> str:
    details = " ".join(
        f"Detail {d}: compare item {d} with item {d + turn} of file {n}." for d in range(12)
    )
    return f"Turn {turn}. {details} Which is heavier?"


@pytest.fixture(scope="module")
def smg():
    executable, note = smg_executable()
    if executable is None:
        unavailable(note)
    return executable


@pytest.fixture(scope="module")
def sidecars(vllm_pool) -> Iterator[list[TokenkeysServe]]:
    # Two engines at once, the pool's (each run of the workload opens with its own number, so
    # what earlier tests left in their caches is never a prefix of it).
    engines = [vllm_pool.get(DEFAULT_CONFIG), vllm_pool.get(DEFAULT_CONFIG.second())]
    fronts: list[TokenkeysServe] = []
    try:
        for engine in engines:
            front = TokenkeysServe(*sidecar_args(engine, "--vllm-engine-face"))
            fronts.append(front)
            front.wait_healthy()
        yield fronts
    finally:
        for front in fronts:
            front.stop()


async def settle(router: SmgRouter, fronts: list[TokenkeysServe]) -> None:
    """Until smg's applied batches stop moving for a few checks (the round's events are in)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_LIMIT_S
    last, still = -1.0, 0
    while still < 5:
        assert loop.time() < deadline, router.log_tail()
        await asyncio.sleep(0.05)
        now = await router.counter("smg_kv_event_batches_total", disposition="applied")
        still = still + 1 if now == last else 0
        last = now


async def play(
    smg, policy: str, run: int, fronts: list[TokenkeysServe], client: httpx.AsyncClient
) -> tuple[int, int]:
    """The workload through smg with ``policy``: (prompt tokens, cached tokens) summed."""
    workers = [f"grpc://{front.target}" for front in fronts]
    history = {c: [{"role": "system", "content": document(c, run)}] for c in range(CONVERSATIONS)}
    prompt = cached = 0
    async with smg_router(smg, policy, workers) as router:
        await settle(router, fronts)
        for turn in range(TURNS):
            for c in range(CONVERSATIONS):
                messages = history[c] + [{"role": "user", "content": question(c, turn)}]
                p, k, reply = await chat(client, router.base, MODEL_NAME, messages, 8)
                prompt, cached = prompt + p, cached + k
                history[c] = messages + [{"role": "assistant", "content": reply}]
                await settle(router, fronts)
    return prompt, cached


async def test_cache_aware_over_our_events_beats_round_robin_by_half_again(smg, sidecars):
    async with httpx.AsyncClient(timeout=600) as client:
        aware = await play(smg, "cache_aware", 1, sidecars, client)
        robin = await play(smg, "round_robin", 2, sidecars, client)
    hit_aware, hit_robin = aware[1] / aware[0], robin[1] / robin[0]
    print(f"vLLM cached_tokens share: cache_aware {hit_aware:.3f}, round_robin {hit_robin:.3f}")
    assert hit_aware >= 1.5 * hit_robin, (hit_aware, hit_robin)
