"""Acceptance (issue 25): hybrid models through the real vLLM, every KV-cache group keyed,
checked and routed, on two layouts.

The models are the tiny random Gemma 3s of ``build_tiny_model.py`` (the embedded SmolLM2
tokenizer), served by vLLM 0.32 with 32-token blocks, prefix caching and KV events:

- ``64-sfsf``: 4 layers alternating a 64-token sliding window and full attention; vLLM keeps
  group 0 (sliding window) and group 1 (full attention);
- ``32-fssfss``: 6 layers, full attention first and two of a 32-token window per full one; vLLM
  keeps group 0 (full attention) and groups 1 and 2 (sliding window, two layers each).

The sidecar learns those groups from vLLM's events at start and serves them in its spec;
``/tokenize`` and the keys equal vLLM's; over shared-prefix workloads with a KV cache small
enough that vLLM evicts window blocks while their full-attention blocks stay, the live key check
counts only matches and the sidecar relays every group's events with their group fields. Behind
``tokenkeys route``, what the router expects cached on the worker it picks equals vLLM's
``cached_tokens`` within a block, and the cached total beats round robin by 1.5x.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import httpx
import pytest
from route_process import RouteProcess

from tokenkeys._gen.openengine.v1 import (
    cache_keys_pb2,
    kv_pb2,
    openengine_pb2_grpc,
    tokenizer_pb2_grpc,
)
from tokenkeys.events.model import BlockRemoved, BlockStored
from tokenkeys.keys import CacheKeySpec, block_keys, make_spec

from served_pair import TokenkeysServe, keys_checked, running, sidecar_args, wait_for
from vllm_events import EventCollector
from vllm_server import BLOCK_SIZE, MODEL_NAME, ServerConfig, VllmServer

pytestmark = pytest.mark.realengine

VOCAB = 49152


@dataclass(frozen=True)
class Layout:
    """One hybrid model as vLLM lays out its KV cache: the groups, in vLLM's order."""

    name: str
    #: (kind, sliding window or 0) per group index.
    groups: tuple[tuple[str, int], ...]
    #: The KV cache's blocks, shared by the groups: a little more than vLLM needs for one
    #: 4096-token request (about 224 blocks for the first layout, 258 for the second: 128
    #: full-attention blocks and, per window group, the window and a 2048-token chunk), so a
    #: few dozen prompts fill it.
    num_blocks: int
    #: Whether vLLM evicts a window block while its full-attention block stays. It frees a
    #: finished request's blocks group by group in group order, each group tail first
    #: (``KVCacheCoordinator.free``, ``SingleTypeKVCacheManager.free``), and evicts the
    #: least recently freed first: with the window group first (``64-sfsf``) its blocks go
    #: before their full-attention twins; with full attention first (``32-fssfss``) the
    #: full-attention block always goes first.
    evicts_window_alone: bool

    @property
    def config(self) -> ServerConfig:
        # Prompt embeds on for the second layout: test_vllm_prompt_embeds.py asks for this
        # server; the schedule runs that module right before this one and this layout's tests
        # first (vllm_schedule.order), so the pool keeps it and one start serves both.
        embeds = self.name != "64-sfsf"
        # A tool parser on the first layout: test_vllm_tools.py routes chat with tools over its
        # two servers (a parser acts on chat only; every other user of them sends completions).
        tools = "pythonic" if self.name == "64-sfsf" else None
        return ServerConfig(
            hybrid=self.name, num_blocks=self.num_blocks, prompt_embeds=embeds, tool_parser=tools
        )

    @property
    def vllm_servers(self) -> tuple[ServerConfig, ServerConfig]:
        """The servers a test of this layout asks the pool for (``vllm_schedule``): the
        layout's, and a second one to route over."""
        return (self.config, self.config.second())

    @property
    def full(self) -> int:
        return next(i for i, (kind, _) in enumerate(self.groups) if kind == "full_attention")

    @property
    def windows(self) -> list[int]:
        return [i for i, (kind, _) in enumerate(self.groups) if kind == "sliding_window"]

    @property
    def window(self) -> int:
        return next(w for _, w in self.groups if w)

    @property
    def tail_blocks(self) -> int:
        """Blocks a window group hashes at a span's end: those covering ``window - 1`` tokens
        (``SlidingWindowManager``: the last token is always recomputed)."""
        return -(-(self.window - 1) // BLOCK_SIZE)

    @property
    def spec(self) -> CacheKeySpec:
        groups = [
            {"kind": kind, "block_size": BLOCK_SIZE, **({"sliding_window": w} if w else {})}
            for kind, w in self.groups
        ]
        return make_spec("vllm/sha256_cbor@0.31", BLOCK_SIZE, groups=groups)

    def described(self) -> str:
        """The sidecar's log line naming the groups (``engine.vllm.groups._describe``)."""
        return ", ".join(
            f"{i} {kind}{f' of {w} tokens' if w else ''} ({BLOCK_SIZE}-token blocks)"
            for i, (kind, w) in enumerate(self.groups)
        )


LAYOUTS = (
    Layout("64-sfsf", (("sliding_window", 64), ("full_attention", 0)), 256, True),
    Layout(
        "32-fssfss",
        (("full_attention", 0), ("sliding_window", 32), ("sliding_window", 32)),
        320,
        False,
    ),
)


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda layout: layout.name)
def layout(request) -> Layout:
    return request.param


@pytest.fixture(scope="module")
def vllm(vllm_pool, layout) -> VllmServer:
    return vllm_pool.get(layout.config)


@pytest.fixture(scope="module")
def engine_events(vllm: VllmServer) -> Iterator[EventCollector]:
    collector = EventCollector(vllm.events_endpoint, vllm.replay_endpoint, vllm.topic, "0.32")
    try:
        yield collector
    finally:
        collector.close()


def prompt_of(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(length)]


def complete(url: str, prompt: list[int]) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response


def cached(response: httpx.Response) -> int:
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def relayed_events(sidecar: TokenkeysServe) -> EventCollector:
    with grpc.insecure_channel(sidecar.target) as channel:
        control = openengine_pb2_grpc.ControlStub(channel)
        sources = control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(), timeout=30)
    source = next(s for s in sources.sources if s.transport == "zmq")
    endpoint = f"tcp://{source.endpoint_addr.host}:{source.endpoint_addr.port}"
    return EventCollector(endpoint, source.replay_endpoint, source.topic, "0.32")


def test_the_sidecar_learns_vllms_groups_and_serves_them(sidecar, layout) -> None:
    with grpc.insecure_channel(sidecar.target) as channel:
        stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
        spec = stub.GetCacheKeySpec(
            cache_keys_pb2.GetCacheKeySpecRequest(model=MODEL_NAME), timeout=30
        )
    groups = [(g.index, g.kind, g.block_size, g.sliding_window) for g in spec.groups]
    assert groups == [(i, kind, BLOCK_SIZE, w) for i, (kind, w) in enumerate(layout.groups)]
    assert spec.fingerprint == layout.spec.fingerprint
    assert f"keeps KV-cache groups {layout.described()}" in sidecar.log_text()


def test_tokenize_and_every_groups_keys_equal_vllms(vllm, sidecar, engine_events, layout):
    text = "A hybrid model keeps one KV-cache group per attention kind: caf\u00e9 \u2166."
    ours = httpx.post(f"{sidecar.url}/tokenize", json={"model": MODEL_NAME, "prompt": text})
    theirs = httpx.post(f"{vllm.url}/tokenize", json={"model": MODEL_NAME, "prompt": text})
    assert ours.json()["tokens"] == theirs.json()["tokens"]
    # The shapes: 490 tokens, then 650 sharing the first 480.
    rng = random.Random(1)
    prefix = prompt_of(rng, 480)
    first, second = prefix + prompt_of(rng, 10), prefix + prompt_of(rng, 170)
    keys = [k.event_key for k in block_keys(second, layout.spec)]
    complete(vllm.url, first)
    assert cached(complete(vllm.url, second)) == 480

    def mine(group: int) -> list[BlockStored]:
        return [
            e
            for e in engine_events.stored()
            if e.group_idx == group and set(e.block_hashes) <= set(keys) and e.block_hashes
        ]

    for group in layout.windows:
        engine_events.wait_until(lambda g=group: len(mine(g)) >= 2, "both window-group stores")
    assert [list(e.block_hashes) for e in mine(layout.full)] == [keys[:15], keys[15:20]]
    tail = layout.tail_blocks  # 2 blocks of a 64-token window, 1 of a 32-token one
    for group in layout.windows:
        window = mine(group)
        assert [list(e.block_hashes) for e in window] == [
            keys[15 - tail : 15],
            keys[20 - tail : 20],
        ]
        assert [len(e.token_ids) for e in window] == [480, 160]  # the whole span, hashes its tail
        assert [e.parent_block_hash for e in window] == [None, keys[14]]
        assert {(e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window) for e in window} == {
            ("sliding_window", layout.window)
        }


def test_key_check_is_exact_for_every_group_while_vllm_evicts(
    vllm, sidecar, engine_events, layout
) -> None:
    relayed = relayed_events(sidecar)
    try:
        before = keys_checked(sidecar.url)
        rng = random.Random(2)
        # 8 (10) prefixes of 16 blocks, 3 turns of 6 new blocks each: more than the cache holds.
        prefixes = [prompt_of(rng, 16 * BLOCK_SIZE) for _ in range(layout.num_blocks // 32)]
        for turn in range(3):
            for prefix in prefixes:
                prompt = prefix + prompt_of(rng, 6 * BLOCK_SIZE + 5 * turn + 3)
                complete(sidecar.url, prompt)
        # Both subscribers see vLLM's batches in order, each at its own pace: every comparison
        # below waits for the workload's last stored block in the collector it reads.
        last = block_keys(prompt, layout.spec)[-1].event_key

        def holds_last(collector: EventCollector) -> bool:
            return any(last in e.block_hashes for e in collector.stored())

        engine_events.wait_until(lambda: holds_last(engine_events), "the workload's last block")
        after = wait_for(
            lambda: (c := keys_checked(sidecar.url))["match"] > before["match"] + 100 and c,
            "the workload's blocks checked",
        )
        assert after["mismatch"] == 0
        # vLLM evicted blocks of every group (in the first layout, window blocks whose
        # full-attention blocks it kept).
        held: dict[int, set] = {i: set() for i in range(len(layout.groups))}
        evicted_alone, removed = 0, set()
        for received in engine_events.received():
            for event in received.batch.events:
                if isinstance(event, BlockStored):
                    held[event.group_idx].update(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    removed.add(event.group_idx)
                    for h in event.block_hashes:
                        held[event.group_idx].discard(h)
                        if event.group_idx in layout.windows and h in held[layout.full]:
                            evicted_alone += 1
        print(
            f"hybrid {layout.name} key check: {after}, window blocks evicted alone: {evicted_alone}"
        )
        assert removed == set(range(len(layout.groups)))
        assert (evicted_alone > 0) == layout.evicts_window_alone
        # Relayed with their group fields, in vLLM's layout.
        relayed.wait_until(lambda: holds_last(relayed), "the workload's last block relayed")
        ours = {
            (e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window, e.block_hashes)
            for e in relayed.stored()
        }
        theirs = {
            (e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window, e.block_hashes)
            for e in engine_events.stored()
        }
        assert {g for g, *_ in ours} == set(range(len(layout.groups))) and ours <= theirs
        assert any(
            e.group_idx in layout.windows
            for r in relayed.received()
            for e in r.batch.events
            if isinstance(e, BlockRemoved)
        )
    finally:
        relayed.close()


# ----------------------------------------------------------------------------- routing


@pytest.fixture(scope="module")
def engines(vllm, vllm_pool, layout) -> list[VllmServer]:
    return [vllm, vllm_pool.get(layout.config.second())]


@pytest.fixture(scope="module")
def sidecars(sidecar, engines) -> Iterator[list[TokenkeysServe]]:
    other = TokenkeysServe(*sidecar_args(engines[1]))
    with running(other):
        yield [sidecar, other]


@dataclass
class Served:
    """What one routed workload got: per request the worker, the blocks the router expected
    and the tokens vLLM served from its cache."""

    workers: list[str]
    pairs: list[tuple[int, int]]

    @property
    def cached(self) -> int:
        return sum(got for _, got in self.pairs)


PREFIXES = 3  # odd, so round robin does not send a prefix to the same worker each round
ROUNDS = 4


def run_workload(url: str, seed: int, wait: bool) -> Served:
    """Conversations on shared prefixes, round after round; see the routing test.

    Each of :data:`PREFIXES` conversations opens with its 10-block prefix and a few tokens (a
    system prompt and a short first question), then asks :data:`ROUNDS` - 1 more times with a
    new 2-block suffix after the prefix. vLLM's window groups keep only the blocks at the end
    of each prompt (``SlidingWindowManager``: a later prompt can resume there, nowhere else),
    so the opening prompt leaves the prefix's own last window blocks cached and every later
    turn on that worker resumes the whole prefix. A later turn on a worker that only saw
    another turn of the conversation resumes nothing: its window blocks end past the prefix
    (vLLM then pins the junction, ``shared_prefix_boundary``, for the turn after).
    """
    rng = random.Random(seed)
    prefixes = [prompt_of(rng, 10 * BLOCK_SIZE) for _ in range(PREFIXES)]
    served = Served([], [])
    with httpx.Client(base_url=url, timeout=300) as client:
        for turn in range(ROUNDS):
            for prefix in prefixes:
                suffix = prompt_of(rng, 7 if turn == 0 else 2 * BLOCK_SIZE + 7)
                body = {"model": MODEL_NAME, "prompt": prefix + suffix, "max_tokens": 1}
                response = client.post("/v1/completions", json=body)
                assert response.status_code == 200, response.text
                matched = response.headers["x-tokenkeys-matched-blocks"].split("/")[0]
                served.workers.append(response.headers["x-tokenkeys-worker"])
                served.pairs.append((int(matched), cached(response)))
                if wait:  # this request's events reached the router: it resumes all of it now
                    wait_for(
                        lambda p=body["prompt"]: (
                            client.post("/router/route", json={"prompt": p}).json()["reason"]
                            == "prefix"
                        ),
                        "the prompt's events at the router",
                    )
    return served


def test_the_router_expects_what_vllm_resumes_and_beats_round_robin(
    sidecars, tmp_path, layout
) -> None:
    # The precise router sends each conversation back to the worker that holds its prefix:
    # every later turn resumes the 10 blocks (3 of 4 turns). Round robin alternates over the
    # two workers, and with an odd number of conversations each one's turns alternate too:
    # only its third turn (back on its first worker) resumes, 1 of 4, so the ratio is 3.
    # The earlier workload (every turn a 2-block suffix, no opening turn) proved little: a
    # second visit to a worker resumes nothing there (its window blocks ended past the prefix)
    # for either policy, so the precise router, told 0 blocks, chose by load (960 tokens when
    # it scattered the conversations), and round robin over two workers could only score 0.
    # Its 1920 vs 1920 (issue 33) is every conversation's four turns on one worker under both
    # policies: one worker out of the pool (in isolated runs both stayed: 960 vs 0 on both
    # layouts), which the test did not check; round robin's turns are checked to alternate
    # now. Both workers must stay in the pool for the comparison to mean anything, hence a
    # poll deadline a sidecar on a loaded machine can meet (the default 2 s, missed a few
    # times in a row, marks a worker down), never a criterion.
    workers = [a for s in sidecars for a in ("--worker", s.target)]
    workers += ["--poll-interval", "1", "--timeout", "10"]
    with RouteProcess(*workers, cache=str(tmp_path / "a")) as router:
        precise = run_workload(router.url, 3, wait=True)
    for expected, got in precise.pairs:
        assert abs(expected * BLOCK_SIZE - got) <= BLOCK_SIZE, precise.pairs
    for i in range(PREFIXES):
        conversation = precise.workers[i::PREFIXES]
        assert len(set(conversation)) == 1, precise.workers  # back to its prefix every turn
    assert all(got == 10 * BLOCK_SIZE for _, got in precise.pairs[PREFIXES:]), precise.pairs
    with RouteProcess(*workers, "--policy", "round_robin", cache=str(tmp_path / "b")) as router:
        round_robin = run_workload(router.url, 4, wait=False)
    turns = round_robin.workers
    assert all(a != b for a, b in itertools.pairwise(turns)), turns  # both workers, in turn
    print(
        f"hybrid {layout.name} routing: cached {precise.cached} vs {round_robin.cached} round "
        f"robin; {precise.pairs}; round robin {round_robin.pairs}"
    )
    assert precise.cached >= 1.5 * round_robin.cached > 0, (precise.cached, round_robin.cached)
