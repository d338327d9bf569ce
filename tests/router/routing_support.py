"""Test helper: simulated engines on loopback gRPC + ZMQ ports, and a router over them.

Everything runs in the test's event loop: engines are ``tests/engine_stack.py`` stacks (the
engine side of ``tokenkeys serve``), the router is the registry + :class:`Router` +
:class:`RoutedEngine` that ``tokenkeys route`` assembles.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from engine_stack import EngineStack, default_models, start_stack
from ports import free_port

from tokenkeys.engine.config import EngineConfig
from tokenkeys.errors import Unavailable
from tokenkeys.events.model import EventBatch
from tokenkeys.keys import CacheKeySpec, make_spec
from tokenkeys.keys.deployment import DEFAULT_PROFILE
from tokenkeys.limits import Limits
from tokenkeys.router.assembly import RouterProcess, RouterProcessConfig
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.metrics import RouterMetrics
from tokenkeys.router.policy.decision import Policy
from tokenkeys.router.policy.router import Router
from tokenkeys.router.routed_engine import RoutedEngine
from tokenkeys.router.service import RoutingConfig, RoutingService
from tokenkeys.router.workers.pool_setup import PoolSettings
from tokenkeys.router.workers.registry import WorkerRegistry
from tokenkeys.serving.models import ModelRegistry, ServedModel, attach_cache_keys

SYSTEM = (
    "You are the support assistant of the Example Rail company. Answer briefly and politely, "
    "quote the timetable when asked about departures, never invent prices, and hand over to a "
    "human for refunds. Stations served: Alder, Birch, Cedar, Dogwood, Elm, Fir, Gum, Hazel. "
)


@functools.lru_cache(maxsize=1)
def _loaded() -> ModelRegistry:
    return default_models()


@functools.lru_cache(maxsize=4)
def _spec(profile: str, block_size: int) -> CacheKeySpec:
    return make_spec(profile, block_size)


def engine_models(profile: str = DEFAULT_PROFILE, block_size: int = 16) -> ModelRegistry:
    """The embedded tokenizer as one served model, with cache keys as ``tokenkeys serve``
    attaches them (``--cache-key-profile``, block size): the engine keys its blocks, its
    events and GetCacheKeySpec / ComputeCacheKeys with this one spec.

    Each engine gets its own registry (its runtime attaches its engine to the model) around
    the same loaded tokenizer, Preprocessor and artifact streamer (loaded once per session).
    """
    models = ModelRegistry()
    for model in _loaded():
        models.add(
            ServedModel(model.name, model.tokenizer, model.preprocessor, artifacts=model.artifacts)
        )
    attach_cache_keys(models, _spec(profile, block_size), Limits())
    return models


#: Picks of an engine's event ports before its first start gives up (each is a random port
#: below the ephemeral range: two processes rarely pick the same one, twice in a row never).
_PICKS = 3


def engine_config(**overrides: object) -> EngineConfig:
    """Fixed ZMQ ports (so an engine restarted in place publishes on the same endpoints)."""
    base: dict[str, object] = {
        "kv_events_port": free_port(),
        "kv_events_replay_port": free_port(),
    }
    base.update(overrides)
    return EngineConfig(**base)  # type: ignore[arg-type]


async def _start_on_fresh_ports(
    config: EngineConfig, models: ModelRegistry, http_port: int | None
) -> tuple[EngineConfig, EngineStack]:
    """Start an engine whose event ports were picked beforehand (to restart it in place on
    them); a pick another process bound in between is picked again, never a restart's."""
    for _ in range(_PICKS):
        try:
            return config, await start_stack(config, models=models, http_port=http_port)
        except Unavailable as exc:
            if "Address already in use" not in str(exc) or not config.kv_events_port:
                raise
            config = replace(config, kv_events_port=free_port(), kv_events_replay_port=free_port())
    return config, await start_stack(config, models=models, http_port=http_port)


@dataclass
class Cluster:
    """Engines and one router over them; ``await cluster.close()`` at the end."""

    stacks: list[EngineStack]
    configs: list[EngineConfig]
    routing: RouterProcess
    stopped: set[int] = field(default_factory=set)

    @property
    def service(self) -> RoutingService:
        return self.routing.service

    @property
    def url(self) -> str:
        """The routing HTTP frontend (clusters started with ``http=True``)."""
        assert self.routing.http is not None
        return f"http://127.0.0.1:{self.routing.http_port}"

    @property
    def registry(self) -> WorkerRegistry:
        return self.service.registry

    @property
    def router(self) -> Router:
        return self.service.router

    @property
    def index(self) -> PrefixIndex:
        return self.service.index

    @property
    def metrics(self) -> RouterMetrics:
        return self.service.metrics

    @property
    def addresses(self) -> list[str]:
        return [s.target for s in self.stacks]

    def engine(self, model: str | None = None) -> RoutedEngine:
        return self.service.engine(model)

    def number(self, address: str) -> int:
        return self.addresses.index(address)

    async def stop_engine(self, i: int) -> None:
        await self.stacks[i].stop()
        self.stopped.add(i)

    async def restart_engine(self, i: int, **overrides: object) -> EngineStack:
        """Start engine ``i`` again on its gRPC port (and ZMQ ports), empty cache."""
        if i not in self.stopped:
            await self.stop_engine(i)
        config = self.configs[i]
        if overrides:
            import dataclasses

            config = dataclasses.replace(config, **overrides)
        models = engine_models(self.stacks[i].local().spec.profile_id)
        self.stacks[i] = await start_stack(config, models=models, port=self.stacks[i].port)
        self.stopped.discard(i)
        return self.stacks[i]

    async def settle(self, timeout: float = 10.0, ignore: tuple[int, ...] = ()) -> None:
        """Wait until the router applied every batch each live engine published so far
        (but those of the engines numbered in ``ignore``).

        A follower catches up when it connects, but a batch lost later (or a catch-up replay
        that failed) shows only when a later batch arrives, so an empty probe batch is
        published when a follower made no progress for a while.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        progress: dict[int, tuple[object, float]] = {}
        while True:
            lagging = []
            for i, stack in enumerate(self.stacks):
                if i in self.stopped or i in ignore:
                    continue
                ws = self.registry.workers.get(stack.target)
                if ws is None or ws.state != "ready":
                    continue
                last = stack.local().stream.next_seq - 1
                for follower in ws.followers.values():
                    # Equal, not "at least": after a restart in place the follower may still
                    # be at a higher sequence number of the previous engine.
                    if last >= 0 and follower.last_seq != last:
                        lagging.append((stack, follower))
            if not lagging:
                return
            assert loop.time() < deadline, f"events not applied in {timeout} s: {lagging}"
            await asyncio.sleep(0.02)
            now = loop.time()
            for stack, follower in lagging:
                # (A follower that has delivered nothing yet, last_seq None, is timed from
                # when it was first seen lagging too.)
                seen, since = progress.setdefault(id(follower), (follower.last_seq, now))
                if seen != follower.last_seq:
                    progress[id(follower)] = (follower.last_seq, now)
                elif now - since > 0.2:
                    stack.local().stream.emit(EventBatch(0.0, ()))
                    progress[id(follower)] = (follower.last_seq, now)

    async def close(self) -> None:
        await self.routing.stop()
        for i, stack in enumerate(self.stacks):
            if i not in self.stopped:
                await stack.stop()


async def start_cluster(
    n: int = 3,
    *,
    settings: PoolSettings,
    index: PrefixIndex | None = None,
    policy: str | Policy = "precise",
    transport: str = "auto",
    configs: list[EngineConfig] | None = None,
    interval: float = 0.2,
    profile: str = DEFAULT_PROFILE,
    models: Callable[[], ModelRegistry] | None = None,
    http: bool = False,
    worker_http: bool = False,
) -> Cluster:
    """``n`` engines keyed by ``profile`` (serving ``models()``, default the embedded
    tokenizer) and a router over them; the registry polls every ``interval`` seconds. With
    ``http`` the router's HTTP frontend listens too (:attr:`Cluster.url`); with
    ``worker_http`` each engine serves its own (the router then forwards to it)."""
    configs = configs or [engine_config() for _ in range(n)]
    make = models or (lambda: engine_models(profile))
    http_port = 0 if worker_http else None
    stacks = []
    for i, engine in enumerate(configs):
        configs[i], stack = await _start_on_fresh_ports(engine, make(), http_port)
        stacks.append(stack)
    config = RoutingConfig(
        workers=tuple(s.target for s in stacks),
        policy=policy,
        transport=transport,
        poll_interval=interval,
        timeout=1.0,
        retry_delay=0.1,
        recheck_interval=0.1,
        pools=settings,
    )
    route = RouterProcessConfig(config, http_port=0 if http else None)
    routing = await RouterProcess(route, index=index).start()
    return Cluster(stacks, configs, routing)


async def collect(engine: RoutedEngine, ids: list[int], **kw: object):  # noqa: ANN201
    """Run one prompt through ``engine``; returns (output token ids, last output)."""
    out: list[int] = []
    last = None
    async for o in engine.generate(ids, **kw):  # type: ignore[arg-type]
        out.extend(o.token_ids)
        last = o
    return out, last


async def wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:  # noqa: ANN001
    """Poll ``predicate()`` (sync or async) every 20 ms until it is true; ``timeout`` is a
    safety net for a loaded machine (a hybrid run's events once took over 10 s), never a
    criterion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert loop.time() < deadline, f"{what} not reached in {timeout} s"
        await asyncio.sleep(0.02)


def prompt_ids(cluster: Cluster, text: str) -> list[int]:
    """Completion-style token ids of ``text`` with the pool's Preprocessor."""
    pool = next(iter(cluster.registry.pools.values()))
    return pool.preprocessor.tokenize_prompts([text])[0].ids


async def routed(cluster: Cluster, ids: list[int], **kw: object):  # noqa: ANN201
    """Route and run one prompt; returns (decision, usage)."""
    from tokenkeys.router.routed_engine import RouteNote, current_note

    note = RouteNote()
    token = current_note.set(note)
    try:
        _, last = await collect(cluster.engine(), ids, **kw)
    finally:
        current_note.reset(token)
    (decision,) = note.decisions
    return decision, last.usage


async def index_run(cluster: Cluster, ids: list[int], address: str) -> int:
    """How many of the prompt's blocks the index says ``address`` holds, from the first."""
    pool = next(iter(cluster.registry.pools.values()))
    keys = await pool.block_keys(ids)
    worker = pool.index_id(address)
    found = await cluster.index.lookup(keys, {worker})
    return found[worker].blocks if worker in found else 0


def engine_run(cluster: Cluster, ids: list[int], i: int) -> int:
    """How many of the prompt's blocks engine ``i`` really holds, from the first."""
    from tokenkeys.keys import block_keys

    local = cluster.stacks[i].local()
    return len(local.engine.cache.match_prefix(block_keys(ids, local.spec)))


async def index_agrees(cluster: Cluster, ids: list[int], address: str) -> bool:
    """Whether the index and engine ``address`` agree on the prompt's run, and it is not empty."""
    held = engine_run(cluster, ids, cluster.number(address))
    return await index_run(cluster, ids, address) == held > 0


def counter(cluster: Cluster, name: str, **labels: str) -> float:
    """Sum of a router counter's samples matching ``labels``."""
    total = 0.0
    for metric in cluster.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
