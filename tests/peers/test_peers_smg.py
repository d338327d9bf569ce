"""Real smg 1.13 (PyPI ``smg==1.13.0``, its own cached venv) routing over tokenkeys engines by gRPC.

``smg launch --worker-urls grpc://...`` in front of ``tokenkeys serve --vllm-engine-face``
engines (simulated, in this process): smg registers them as vLLM workers, loads its tokenizer
from their ``GetTokenizer`` (the folder they were loaded from is deleted first and the Hub is
offline, so no other source exists), sends token ids equal to ours, and its ``cache_aware``
policy indexes their ``SubscribeKvEvents``: a prefix stored on one engine behind smg's back
routes there. Cache hits are the engines' own ``cached_tokens``. smg's counters
(``smg_kv_event_batches_total``, ``smg_cache_aware_policy_branch_total``) say when it applied the
events and which branch chose the worker; they order the steps, nothing is timed.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from engine_stack import EngineStack, start_stack
from evidence import unavailable
from smg_gateway import SmgRouter, chat, smg_executable, smg_router

from tokenkeys.engine.config import EngineConfig
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions, default_tokenizer_path

from smg_stubs import require_smg_stubs

require_smg_stubs()

from tokenkeys.server.grpc.vllm_engine.stubs import vllm_engine_pb2 as pb  # noqa: E402
from tokenkeys.server.grpc.vllm_engine.stubs import vllm_engine_pb2_grpc  # noqa: E402

pytestmark = pytest.mark.peers

MODEL = "smol"
# A guard against a wedged gateway, not a measurement.
WAIT_LIMIT_S = 60.0
TEXTS = [
    "Hello world, tokenizers!",
    "  leading spaces and\ttabs\nand new lines  ",
    "Ünïcödé, emoji 🤖 and 日本語のテキスト",
    "<|im_start|>special tokens as text<|im_end|>",
]


def system_prompt(n: int) -> str:
    return (f"You are assistant number {n}. " + "Answer with care and cite sources. " * 12).strip()


@pytest.fixture(scope="module")
def smg() -> Path:
    executable, note = smg_executable()
    if executable is None:
        unavailable(note)
    return executable


#: Each engine's first sequence number, by gRPC target.
ORIGINS: dict[str, int] = {}


async def _engines(tmp_path: Path, count: int) -> list[EngineStack]:
    """``count`` engines serving a copy of the embedded tokenizer, the copy deleted after load."""
    stacks = []
    for index in range(count):
        folder = tmp_path / f"tokenizer-{index}"
        shutil.copytree(default_tokenizer_path(), folder)
        models = load_models([ModelSource(MODEL, folder)], TokenizerOptions(), Limits())
        stack = await start_stack(EngineConfig(), models=models, vllm_engine_face=True)
        ORIGINS[stack.target] = stack.local(MODEL).stream.next_seq
        stacks.append(stack)
        shutil.rmtree(folder)  # the engine holds the bytes it loaded; smg must ask for them
    return stacks


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[list[EngineStack]]:
    stacks = await _engines(tmp_path, 2)
    yield stacks
    for stack in stacks:
        await stack.stop()


def urls(stacks: list[EngineStack]) -> list[str]:
    return [f"grpc://{stack.target}" for stack in stacks]


async def wait_applied(router: SmgRouter, stack: EngineStack) -> None:
    """Until smg has applied every KV-event batch ``stack``'s engine published."""
    published = stack.local(MODEL).stream.next_seq - ORIGINS[stack.target]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_LIMIT_S
    while (
        await router.counter(
            "smg_kv_event_batches_total", worker=f"grpc://{stack.target}", disposition="applied"
        )
        < published
    ):
        assert loop.time() < deadline, f"smg never applied {published} batches: {router.log_tail()}"
        await asyncio.sleep(0.05)


async def test_smg_loads_our_tokenizer_from_get_tokenizer_and_its_ids_equal_ours(smg, two):
    ours = two[0].models.get(MODEL).preprocessor
    async with (
        smg_router(smg, "cache_aware", urls(two)) as router,
        httpx.AsyncClient(timeout=60) as client,
    ):
        listed = (await client.get(f"{router.base}/v1/tokenizers")).json()["tokenizers"]
        assert [t["name"] for t in listed] == [MODEL]
        assert listed[0]["vocab_size"] == two[0].models.get(MODEL).tokenizer.vocab_size
        for text in TEXTS:
            # smg's /v1/tokenize encodes without special tokens.
            body = {"model": MODEL, "prompt": text}
            answer = (await client.post(f"{router.base}/v1/tokenize", json=body)).json()
            expected = ours.tokenize_prompts([text], add_special_tokens=False)[0].ids
            assert answer["tokens"] == expected, text
        messages = [
            {"role": "system", "content": system_prompt(0)},
            {"role": "user", "content": "hi"},
        ]
        prompt_tokens, cached, _ = await chat(client, router.base, MODEL, messages, 4)
        rendered = ours.tokenize_chat({"messages": messages, "add_generation_prompt": True})
        # smg rendered the chat with the template from our bundle: the engine counted our ids.
        assert prompt_tokens == len(rendered.tokens.ids)
        assert cached == 0


async def test_cache_aware_routes_a_prefix_to_the_engine_its_events_say_holds_it(smg, two):
    async with (
        smg_router(smg, "cache_aware", urls(two)) as router,
        httpx.AsyncClient(timeout=60) as client,
    ):
        ours = two[0].models.get(MODEL).preprocessor
        placed = {}
        # Store each prefix on one engine directly, behind smg's back: only the events tell it.
        for n in range(6):
            messages = [
                {"role": "system", "content": system_prompt(n)},
                {"role": "user", "content": "question"},
            ]
            ids = ours.tokenize_chat({"messages": messages, "add_generation_prompt": True})
            holder = two[n % 2]
            face = vllm_engine_pb2_grpc.VllmEngineStub(holder.channel)
            request = pb.GenerateRequest(
                request_id=f"seed-{n}",
                tokenized=pb.TokenizedInput(input_ids=ids.tokens.ids),
                sampling_params=pb.SamplingParams(max_tokens=1),
            )
            [m async for m in face.Generate(request)]
            placed[n] = (messages, holder)
        for stack in two:
            await wait_applied(router, stack)
        before = await router.counter("smg_cache_aware_policy_branch_total", branch="event_hit")
        for messages, holder in placed.values():
            served_before = holder.local(MODEL).engine.stats.requests
            prompt_tokens, cached, _ = await chat(client, router.base, MODEL, messages, 2)
            # Routed to the holder (its request count moved) and served from its cache.
            assert holder.local(MODEL).engine.stats.requests == served_before + 1
            assert cached == (prompt_tokens - 1) // 16 * 16 > 0
        after = await router.counter("smg_cache_aware_policy_branch_total", branch="event_hit")
        assert after - before == len(placed)
