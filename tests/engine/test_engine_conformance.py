"""One suite for every engine kind: each satisfies :class:`tokenkeys.engine.protocol.Engine`.

The serving layers (gRPC ``Inference``, the HTTP routes) call nothing but the Protocol, so
every kind must behave alike through it: the simulated engine of ``tokenkeys serve`` (local),
an OpenEngine engine over gRPC (remote) and the worker a router picks (routed). Each runs for
real on loopback ports. A new engine kind is one context manager below and one entry in
:data:`KINDS`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from engine_stack import start_stack
from router.routing_support import engine_config, engine_models, start_cluster

from tokenkeys.client.engine import RemoteEngine
from tokenkeys.engine.core import GenerateOutput, GenerationParams
from tokenkeys.engine.latency import LatencyModel
from tokenkeys.engine.protocol import Engine, EngineLoad
from tokenkeys.errors import InvalidArgument
from tokenkeys.keys import Adapter
from tokenkeys.router.workers.pool_setup import PoolSettings

#: The context every engine under test accepts (prompt plus output, in tokens).
MAX_MODEL_LEN = 256
PROMPT = list(range(1000, 1100))  # 100 tokens: six full 16-token blocks


def _config():  # noqa: ANN202 - an EngineConfig
    return engine_config(max_model_len=MAX_MODEL_LEN, latency=LatencyModel(sleep=False))


@contextlib.asynccontextmanager
async def local_engine(tmp_path: Path) -> AsyncIterator[Engine]:
    stack = await start_stack(_config(), models=engine_models())
    try:
        yield stack.local()
    finally:
        await stack.stop()


@contextlib.asynccontextmanager
async def remote_engine(tmp_path: Path) -> AsyncIterator[Engine]:
    stack = await start_stack(_config(), models=engine_models())
    channel = grpc.aio.insecure_channel(stack.target)
    engine = RemoteEngine(stack.target, stack.models.names[0], channel, owns_channel=True)
    try:
        yield engine
    finally:
        await engine.close()
        await stack.stop()


@contextlib.asynccontextmanager
async def routed_engine(tmp_path: Path) -> AsyncIterator[Engine]:
    cluster = await start_cluster(
        1, settings=PoolSettings(cache=tmp_path / "cache"), configs=[_config()]
    )
    try:
        yield cluster.engine()
    finally:
        await cluster.close()


KINDS: dict[str, Callable[[Path], contextlib.AbstractAsyncContextManager[Engine]]] = {
    "local": local_engine,
    "remote": remote_engine,
    "routed": routed_engine,
}


@pytest.fixture(params=sorted(KINDS))
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Engine]:
    async with KINDS[request.param](tmp_path) as running:
        yield running


async def _run(engine: Engine, ids: list[int], max_tokens: int = 4) -> list[GenerateOutput]:
    outputs = engine.generate(ids, GenerationParams(max_tokens=max_tokens, seed=7))
    async with contextlib.aclosing(outputs) as stream:
        return [o async for o in stream]


async def test_it_is_an_engine(engine: Engine) -> None:
    assert isinstance(engine, Engine)


async def test_one_output_per_token_usage_on_the_last(engine: Engine) -> None:
    outputs = await _run(engine, PROMPT, max_tokens=5)
    assert [len(o.token_ids) for o in outputs] == [1] * 5
    assert [o.finished for o in outputs] == [False] * 4 + [True]
    last = outputs[-1]
    assert last.finish_reason == "length"
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(PROMPT), 5)


async def test_the_same_seed_gives_the_same_tokens_and_a_prefix_hit(engine: Engine) -> None:
    first = await _run(engine, PROMPT)
    second = await _run(engine, PROMPT)
    assert [o.token_ids for o in first] == [o.token_ids for o in second]
    assert first[-1].usage is not None and second[-1].usage is not None
    assert first[-1].usage.cached_prompt_tokens == 0
    assert second[-1].usage.cached_prompt_tokens == 96  # six full blocks, as vLLM caps a hit


async def test_a_prompt_past_the_context_is_refused(engine: Engine) -> None:
    limit = engine.max_model_len
    assert limit is None or limit == MAX_MODEL_LEN  # None: the engine behind checks it
    # ContextLengthExceeded is a bad request (INVALID_ARGUMENT, HTTP 400) as vLLM answers it.
    with pytest.raises(InvalidArgument):
        await _run(engine, list(range(MAX_MODEL_LEN)), max_tokens=4)


async def test_adapters_and_load(engine: Engine) -> None:
    assert all(isinstance(a, Adapter) for a in engine.adapters)
    await _run(engine, PROMPT)
    load = await engine.load()
    assert isinstance(load, EngineLoad)
    assert load.running == 0 and load.waiting == 0  # nothing left running after a request
    assert 0 <= load.used_kv_blocks <= load.total_kv_blocks


async def test_a_stream_closed_early_frees_the_request(engine: Engine) -> None:
    outputs = engine.generate(PROMPT, GenerationParams(max_tokens=50, seed=1))
    async with contextlib.aclosing(outputs) as stream:
        async for _ in stream:
            break
    # The engine answers the next request in full: the abandoned one holds nothing it needs.
    assert (await _run(engine, PROMPT, max_tokens=3))[-1].finished


async def test_close_is_idempotent(engine: Engine) -> None:
    await engine.close()
    await engine.close()
