"""One suite for every engine kind: each satisfies :class:`tokenkeys.engine.protocol.Engine`.

The serving layers (gRPC ``Inference``, the HTTP routes) call nothing but the Protocol, so
every kind must behave alike through it: the simulated engine of ``tokenkeys serve`` (local),
an OpenEngine engine over gRPC (remote), the worker a router picks (routed), and a real vLLM
0.32 behind the sidecar (``serve --engine vllm+http://…``; marker ``realengine``, on the vLLM
server pool the real-engine tests share). Each runs for real on loopback ports. A new engine
kind is one context manager below and one entry in :data:`KINDS`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from engine_stack import start_stack
from router.routing_support import engine_config, engine_models, start_cluster

from tokenkeys.engine import registry as engine_registry
from tokenkeys.engine.config import EngineConfig, SimulatedConfig, VllmEngineConfig
from tokenkeys.engine.protocol import Engine, EngineLoad, GenerateOutput, GenerationParams
from tokenkeys.engine.remote import RemoteEngine
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.keys import Adapter, KeyContext, MMItem, make_spec
from tokenkeys.limits import Limits
from tokenkeys.router.workers.pool_setup import PoolSettings
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

from vllm_server import DEFAULT_CONFIG

#: The context the simulated engines under test accept (prompt plus output, in tokens).
MAX_MODEL_LEN = 256
PROMPT = list(range(1000, 1100))  # 100 tokens: six full 16-token blocks, three of 32


@dataclass(frozen=True)
class Subject:
    """An engine under test and what the suite must know of the engine behind it.

    ``block_size``: its KV blocks (prefix hits come in whole blocks); ``context``: the context
    length of the engine that judges a request (a kind that forwards may state none itself);
    ``reproducible``: whether the same seed is promised the same tokens (see the vLLM kind);
    ``takes_media``: whether it keys a context's image items (else refuses them, naming
    ``media``: the sidecar, whose vLLM takes images only inside messages).
    """

    engine: Engine
    block_size: int = 16
    context: int = MAX_MODEL_LEN
    reproducible: bool = True
    takes_media: bool = True


def _config():  # noqa: ANN202 - an EngineConfig
    return engine_config(
        engine=SimulatedConfig(latency=LatencyModel(sleep=False)), max_model_len=MAX_MODEL_LEN
    )


@contextlib.asynccontextmanager
async def local_engine(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
    stack = await start_stack(_config(), models=engine_models())
    try:
        yield Subject(stack.local())
    finally:
        await stack.stop()


@contextlib.asynccontextmanager
async def remote_engine(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
    stack = await start_stack(_config(), models=engine_models())
    channel = grpc.aio.insecure_channel(stack.target)
    engine = RemoteEngine(stack.target, stack.models.names[0], channel, owns_channel=True)
    try:
        yield Subject(engine)
    finally:
        await engine.close()
        await stack.stop()


@contextlib.asynccontextmanager
async def routed_engine(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
    tmp_path: Path = request.getfixturevalue("tmp_path")
    cluster = await start_cluster(
        1, settings=PoolSettings(cache=tmp_path / "cache"), configs=[_config()]
    )
    try:
        yield Subject(cluster.engine())
    finally:
        await cluster.close()


@contextlib.asynccontextmanager
async def vllm_engine(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
    """The sidecar's engine, built by the same assembly as ``tokenkeys serve --engine vllm+…``
    (start checks, event relay, key check), in front of the pool's default vLLM server: the
    one the real-engine parity modules use (it is planned there: ``VLLM_MARKS``). In a whole
    run this module is the first on that server (the schedule keeps collection order among
    the modules of one configuration), so this case starts it and the parity modules reuse it."""
    from served_pair import EMBEDDED
    from vllm_server import BLOCK_SIZE, MODEL_NAME

    server = request.getfixturevalue("vllm_pool").get(DEFAULT_CONFIG)
    models = load_models(
        [ModelSource(MODEL_NAME, EMBEDDED)],
        TokenizerOptions(backend="transformers5"),  # vLLM 0.32's tokenization
        Limits(),
    )
    sidecar = VllmEngineConfig(
        server.url, server.events_endpoint, server.replay_endpoint, server.topic
    )
    config = EngineConfig(engine=sidecar, kv_events_vllm_version="0.32")
    spec = make_spec("vllm/sha256_cbor@0.31", BLOCK_SIZE)  # vLLM's default root
    stack = await start_stack(config, models=models, spec=spec)
    engine = stack.models.get(None).engine
    assert engine is not None and engine.max_model_len is not None
    try:
        # vLLM promises the same tokens for the same seed only with batch invariance
        # (docs.vllm.ai "Reproducibility", 0.32: "In online mode, you can only enable batch
        # invariance"), which this server does not run; and a repeated prompt is computed
        # from cached KV, another numeric path than its first prefill.
        yield Subject(
            engine, BLOCK_SIZE, engine.max_model_len, reproducible=False, takes_media=False
        )
    finally:
        await stack.stop()


#: The vLLM case runs on the pool's default server (``vllm_schedule`` plans it there, and
#: starts it for this case when the run includes it).
VLLM_MARKS = [pytest.mark.realengine, pytest.mark.vllm_servers(DEFAULT_CONFIG)]

KINDS: dict[str, Callable[[pytest.FixtureRequest], contextlib.AbstractAsyncContextManager]] = {
    "simulated": local_engine,
    "remote": remote_engine,
    "routed": routed_engine,
    "vllm": vllm_engine,
}


def test_every_registered_kind_is_in_the_suite() -> None:
    # A kind added to the registry without a case here would go unchecked.
    assert set(engine_registry.KINDS) <= set(KINDS)


@pytest.fixture(
    params=[
        pytest.param(kind, marks=VLLM_MARKS) if kind == "vllm" else kind for kind in sorted(KINDS)
    ]
)
async def subject(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
    async with KINDS[request.param](request) as running:
        yield running


def fresh_prompt(label: str) -> list[int]:
    """100 ids no other test sends: a real engine's prefix cache outlives one test."""
    return random.Random(label).sample(range(1000, 40_000), 100)


async def _run(
    engine: Engine, ids: list[int], max_tokens: int = 4, context: KeyContext | None = None
) -> list[GenerateOutput]:
    outputs = engine.generate(ids, GenerationParams(max_tokens=max_tokens, seed=7), context)
    async with contextlib.aclosing(outputs) as stream:
        return [o async for o in stream]


async def test_it_is_an_engine(subject: Subject) -> None:
    assert isinstance(subject.engine, Engine)


async def test_one_output_per_token_usage_on_the_last(subject: Subject) -> None:
    outputs = await _run(subject.engine, PROMPT, max_tokens=5)
    assert [len(o.token_ids) for o in outputs] == [1] * 5
    assert [o.finished for o in outputs] == [False] * 4 + [True]
    last = outputs[-1]
    assert last.finish_reason == "length"
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(PROMPT), 5)


async def test_a_repeated_prompt_hits_the_prefix_cache(subject: Subject) -> None:
    prompt = fresh_prompt("a repeated prompt")
    first = await _run(subject.engine, prompt)
    second = await _run(subject.engine, prompt)
    assert first[-1].usage is not None and second[-1].usage is not None
    assert first[-1].usage.cached_prompt_tokens == 0
    # Whole blocks, with at least one prompt token left to compute (vLLM caps a hit there).
    hit = (len(prompt) - 1) // subject.block_size * subject.block_size
    assert second[-1].usage.cached_prompt_tokens == hit
    assert len(first) == len(second) == 4
    if subject.reproducible:  # the same seed, the same tokens
        assert [o.token_ids for o in first] == [o.token_ids for o in second]


async def test_a_prompt_filling_the_context_is_refused_in_vllms_words(subject: Subject) -> None:
    engine = subject.engine
    assert engine.max_model_len in (None, subject.context)  # None: the engine behind judges
    # No room for one token: a bad request (INVALID_ARGUMENT, HTTP 400) worded as vLLM 0.32
    # words it, whichever engine judged (engine/context_window.py is the simulated engine's).
    with pytest.raises(InvalidArgument, match=r"max_tokens must be at least 1, got 0\."):
        await _run(engine, list(range(subject.context)), max_tokens=4)


async def test_image_items_key_their_blocks_or_are_refused(subject: Subject) -> None:
    """An image item (identifier, placeholder run) enters the keys of the blocks it reaches:
    the same ids with another identifier hit only the blocks before the item; a kind that
    cannot key items refuses them instead of keying the blocks as text."""
    prompt = fresh_prompt("image items")

    def image(identifier: str) -> KeyContext:
        return KeyContext(mm_items=(MMItem(identifier, 40, 30),))

    if not subject.takes_media:
        with pytest.raises(Unsupported) as info:
            await _run(subject.engine, prompt, context=image("a" * 64))
        assert info.value.field == "media"
        return
    bs = subject.block_size
    first = await _run(subject.engine, prompt, context=image("a" * 64))
    other = await _run(subject.engine, prompt, context=image("b" * 64))
    same = await _run(subject.engine, prompt, context=image("a" * 64))
    usage = [r[-1].usage for r in (first, other, same)]
    assert all(u is not None for u in usage)
    assert usage[0].cached_prompt_tokens == 0
    assert usage[1].cached_prompt_tokens == 40 // bs * bs  # the blocks before the image only
    assert usage[2].cached_prompt_tokens == (len(prompt) - 1) // bs * bs


async def test_adapters_and_load(subject: Subject) -> None:
    engine = subject.engine
    assert all(isinstance(a, Adapter) for a in engine.adapters)
    await _run(engine, PROMPT)
    load = await engine.load()
    assert isinstance(load, EngineLoad)
    assert load.running == 0 and load.waiting == 0  # nothing left running after a request
    assert 0 <= load.used_kv_blocks <= load.total_kv_blocks


async def test_a_stream_closed_early_frees_the_request(subject: Subject) -> None:
    engine = subject.engine
    outputs = engine.generate(PROMPT, GenerationParams(max_tokens=50, seed=1))
    async with contextlib.aclosing(outputs) as stream:
        async for _ in stream:
            break
    # The engine answers the next request in full: the abandoned one holds nothing it needs.
    assert (await _run(engine, PROMPT, max_tokens=3))[-1].finished


async def test_close_is_idempotent(subject: Subject) -> None:
    await subject.engine.close()
    await subject.engine.close()
