"""A hybrid model routed without a vLLM: simulated engines with a sliding-window group.

Two ``tokenkeys serve`` engines (in process, real gRPC and ZMQ on loopback) keep the layout of
``--kv-groups sliding_window@32:16,full_attention:16`` (a 2-block window, as 64 tokens are two of
vLLM's 32-token blocks), behind a router. For every request what the router expected cached on
the worker it chose (``matched_blocks``) is what that engine reported (``cached_tokens``): a
repeated prefix resumes to the window's blocks, a shared prefix whose window blocks the engine
no longer holds is not resumed, although every full-attention block of it is cached.
"""

from __future__ import annotations

import pytest
from engine_stack import default_models
from routing_support import routed, start_cluster, wait_until

from tokenkeys.engine.protocol import GenerationParams
from tokenkeys.keys import make_spec
from tokenkeys.limits import Limits
from tokenkeys.router.policy.router import RouteRequest
from tokenkeys.router.workers.pool_setup import PoolSettings
from tokenkeys.serving.models import ModelRegistry, ServedModel, attach_cache_keys

# Every decision here through the compiled ranking and through the Python path (conftest).
pytestmark = pytest.mark.usefixtures("rank_core")

BS = 16
ONE = GenerationParams(max_tokens=1)
SPEC = make_spec(
    "vllm/sha256_cbor@0.31",
    BS,
    groups=[
        {"kind": "sliding_window", "block_size": BS, "sliding_window": 2 * BS},
        {"kind": "full_attention", "block_size": BS},
    ],
)


def hybrid_models() -> ModelRegistry:
    models = ModelRegistry()
    for model in default_models():
        models.add(
            ServedModel(model.name, model.tokenizer, model.preprocessor, artifacts=model.artifacts)
        )
    attach_cache_keys(models, SPEC, Limits())
    return models


@pytest.fixture
def settings(tmp_path):  # noqa: ANN001, ANN201
    return PoolSettings(cache=tmp_path / "cache")


def ids(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


async def test_the_router_expects_what_the_hybrid_engine_resumes(settings):
    cluster = await start_cluster(2, settings=settings, models=hybrid_models)
    try:
        pool = next(iter(cluster.registry.pools.values()))
        assert [(w.index, w.need) for w in pool.layout.windows] == [(0, 2)]
        prefix = ids(1000, 10 * BS)
        first = prefix + ids(5000, 2 * BS + 3)
        decision, usage = await routed(cluster, first, params=ONE)
        assert (decision.matched_blocks, usage.cached_prompt_tokens) == (0, 0)
        worker = decision.worker

        async def resumes(prompt: list[int], blocks: int) -> bool:
            ranked = await cluster.router.route(RouteRequest(prompt), record=False)
            return ranked.cached_blocks(worker) == blocks

        # The same prompt again: every full block but the last token's resumes (12 blocks).
        await wait_until(lambda: resumes(first, 12), what="the first prompt's events indexed")
        decision, usage = await routed(cluster, first, params=ONE)
        assert decision.worker == worker
        assert decision.matched_blocks * BS == usage.cached_prompt_tokens == 12 * BS
        # A new suffix on the shared prefix: the window kept blocks 10-11 of the first prompt,
        # not 8-9, so the engine resumes nothing, and the router expects nothing.
        other = prefix + ids(7000, 2 * BS + 3)
        decision, usage = await routed(cluster, other, params=ONE)
        assert decision.matched_blocks * BS == usage.cached_prompt_tokens == 0
    finally:
        await cluster.close()
