"""Router replicas sharing their requests in flight and cache growth through a real Redis.

Two :class:`RedisSharedLoad` instances stand for two replicas; each decides on its own memory
at once and applies the other's stream entries to its own load views as they arrive.
The pools are stand-ins holding only what the shared load touches (``members[address].view``,
a real ``LoadView``): the pool machinery (discovery, artifacts) plays no part here and is
tested in ``test_router_pool.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from routing_support import wait_until

from tokenkeys.errors import ConfigError
from tokenkeys.router.policy.cost import GrowthLedger
from tokenkeys.router.policy.placement import LocalPlacements, Placement
from tokenkeys.router.replicas.contention import Contention
from tokenkeys.router.replicas.shared_load import RedisSharedLoad
from tokenkeys.router.replicas.sharing import LocalLoad
from tokenkeys.router.service import RoutingConfig, RoutingService
from tokenkeys.router.workers.load_view import Flight, LoadView

T = TypeVar("T")


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Member:
    view: LoadView = field(default_factory=LoadView)


@dataclass
class Pool:
    members: dict[str, Member]


class Replica:
    """One replica's side: its pools' views, its growth ledgers, its shared load."""

    def __init__(self, url: str, namespace: str, **options: Any) -> None:
        self.pools = {"m": Pool({"w1": Member(), "w2": Member()})}
        self.ledgers: dict[str, GrowthLedger] = {}
        self.shared = RedisSharedLoad(url, namespace=namespace, **options)

    def view(self, address: str) -> LoadView:
        return self.pools["m"].members[address].view

    async def start(self) -> Replica:
        await self.shared.start(self.pools, lambda m: self.ledgers.setdefault(m, GrowthLedger()))
        await wait_until(lambda: self.shared.following, what="subscribed")
        return self


@pytest.fixture
async def replicas(redis_url):
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    made = [await Replica(redis_url, namespace).start() for _ in range(2)]
    yield made
    for replica in made:
        await replica.shared.close()


async def test_a_peers_flight_counts_here_until_it_ends(replicas):
    a, b = replicas
    flight = a.view("w1").begin([1, 2, 3, 4], cached=1)
    a.shared.sent("m", "w1", flight)
    await wait_until(lambda: b.view("w1").inflight == 1, what="peer flight")
    seen = b.view("w1")
    assert seen.inflight_prefix([1, 2, 3, 4, 9]) == 4 and seen.own_blocks == 5
    assert seen.queued_prefill(frozenset()) == 3  # its blocks 2-4 are prefilled there
    assert b.view("w2").inflight == 0 and a.shared.peer_flights == 0
    # B's own request of the same prompt now computes none of those blocks there.
    assert b.view("w1").begin([1, 2, 3, 4, 5], cached=0).fresh == (5,)

    a.view("w1").first_output(flight)
    a.shared.answered(flight)
    await wait_until(lambda: b.view("w1").queued_prefill(frozenset()) == 1, what="prefill done")
    a.view("w1").end(flight)
    a.shared.finished(flight)
    await wait_until(lambda: b.shared.peer_flights == 0, what="peer flight ended")
    assert b.view("w1").inflight == 1  # B's own request alone (it did not publish it)
    assert a.view("w1").inflight == 0


def _decision(replica: Replica, address: str, keys: tuple[int, ...], growth: float, seen: list):
    """A decision that always picks ``address``, noting what it saw of the peer's flights."""

    def decide() -> tuple[Placement, str]:
        seen.append(replica.view("w1").inflight + replica.view("w2").inflight)
        fresh = replica.view(address).fresh(keys)
        return Placement("m", address, keys, fresh, growth), address

    return decide


def _send(replica: Replica, address: str, keys: tuple[int, ...]) -> Flight:
    """What the routed engine does once a decision returns: begin the flight and tell it."""
    flight = replica.view(address).begin(keys)
    replica.shared.sent("m", address, flight)
    return flight


def _no_suspension(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end in one step: it must never wait (no I/O, no awaiting a
    future), or this raises."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise AssertionError("the decision suspended: it waited for something")


async def test_a_placement_reaches_every_replica_once_with_its_growth(replicas):
    a, b = replicas
    seen: list[int] = []
    assert await a.shared.place(_decision(a, "w2", (4, 5, 6), 12.0, seen)) == "w2"
    flight = _send(a, "w2", (4, 5, 6))
    await wait_until(lambda: b.view("w2").inflight == 1, what="placed flight")
    assert "m" in b.ledgers and b.ledgers["m"].get("w2") == 12.0  # the decision's growth
    # Own placements are not replayed here (the policy records their growth itself).
    assert "m" not in a.ledgers and a.view("w2").inflight == 1
    assert b.view("w2").queued_prefill(frozenset()) == 3
    a.shared.finished(flight)
    await wait_until(lambda: b.shared.peer_flights == 0, what="placed flight ended")
    assert b.view("w2").inflight == 0 and seen == [0]


async def test_the_decision_path_makes_no_redis_call(start_redis):
    """Decisions and what the routed engine tells after them complete while Redis is paused
    (every client's commands held, the pausing one's too, until the pause ends), each in one
    step of its coroutine: nothing on the path waits for the network. What they placed reaches
    the peer once the pause is over (the replicas' call timeout outlasts it)."""
    server = start_redis()
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    a = await Replica(server.url, namespace, timeout=30.0, heartbeat=0.2).start()
    b = await Replica(server.url, namespace, timeout=30.0, heartbeat=0.2).start()
    admin = redis.asyncio.Redis.from_url(server.url)
    try:
        await admin.execute_command("CLIENT", "PAUSE", 5_000, "ALL")
        await asyncio.sleep(0.05)  # the replicas' next calls are now held by the server
        for i in range(20):
            address = ("w1", "w2")[i % 2]
            keys = (100 + i, 200 + i)
            picked = _no_suspension(a.shared.place(_decision(a, address, keys, 2.0, [])))
            assert picked == address
            _send(a, address, keys)
        assert a.view("w1").inflight == a.view("w2").inflight == 10
        assert b.shared.peer_flights == 0  # nothing could be told yet
        await wait_until(lambda: b.shared.peer_flights == 20, what="told after the pause")
        assert b.ledgers["m"].get("w1") > 0 and b.ledgers["m"].get("w2") > 0
        assert a.shared.dropped == 0
    finally:
        await admin.aclose()
        await a.shared.close()
        await b.shared.close()


def _counts(view: LoadView) -> tuple[int, dict[int, int], dict[int, int]]:
    return view.inflight, dict(view.inflight_keys), dict(view.prefilling_keys)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 2),  # which replica
            st.sampled_from(["send", "answer", "finish"]),
            st.sampled_from(["w1", "w2"]),
            st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple),
        ),
        min_size=1,
        max_size=30,
    )
)
async def test_replicas_converge_to_the_same_flights_once_the_stream_is_drained(redis_url, steps):
    """Whatever three replicas send, answer and finish, in whatever interleaving, each counts
    the same requests in flight on every worker (blocks in use, prefill queued) once every
    entry is applied: its own as it did them, the peers' as told."""
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    made = [await Replica(redis_url, namespace).start() for _ in range(3)]
    try:
        flights: list[list[tuple[str, Flight]]] = [[] for _ in made]
        for i, (who, action, address, keys) in enumerate(steps):
            r = made[who]
            if action == "send":
                flights[who].append((address, _send(r, address, keys)))
            elif flights[who]:
                address, flight = flights[who][len(flights[who]) // 2]
                if action == "answer":
                    r.view(address).first_output(flight)
                    r.shared.answered(flight)
                else:
                    flights[who].remove((address, flight))
                    r.view(address).end(flight)
                    r.shared.finished(flight)
            if i % 7 == 0:
                await asyncio.sleep(0)  # some steps interleave with the peers' entries
        total = sum(len(f) for f in flights)

        def drained() -> bool:
            return all(
                r.shared.peer_flights == total - len(f) for r, f in zip(made, flights, strict=True)
            )

        await wait_until(drained, what="every entry applied")

        def counts(r: Replica) -> list[tuple[int, dict[int, int], dict[int, int]]]:
            return [_counts(r.view(w)) for w in ("w1", "w2")]

        await wait_until(lambda: counts(made[0]) == counts(made[1]) == counts(made[2]))
        assert sum(c[0] for c in counts(made[0])) == total
    finally:
        for r in made:
            await r.shared.close()


async def test_decisions_at_the_same_instant_are_counted_not_hidden(replicas):
    """Two replicas place one prefix on two workers before either hears the other: the pair
    is counted once, as a split prefix computed twice; a later decision that heard the first
    is not counted."""
    a, b = replicas
    keys = (1, 2, 3)
    _send(a, "w1", keys)  # the same loop turn: neither entry has reached the other
    _send(b, "w2", keys + (4,))
    await wait_until(lambda: a.shared.peer_flights == b.shared.peer_flights == 1, what="told")
    ca, cb = a.shared.contention, b.shared.contention
    assert ca.concurrent + cb.concurrent == 1
    assert ca.split + cb.split == 1 and ca.split_blocks + cb.split_blocks == 3
    assert ca.piled + cb.piled == 0
    # B decides again, having heard A: nothing concurrent.
    _send(b, "w1", keys)
    await wait_until(lambda: a.shared.peer_flights == 2, what="told")
    assert ca.concurrent + cb.concurrent == 1
    # Unrelated new prompts on one worker at the same instant: piled.
    _send(a, "w2", (7, 8))
    _send(b, "w2", (9,))
    await wait_until(lambda: (a.shared.peer_flights, b.shared.peer_flights) == (3, 2))
    assert ca.concurrent + cb.concurrent == 2 and ca.piled + cb.piled == 1


async def test_a_decision_no_request_follows_tells_its_growth_alone(redis_url):
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    clock = Clock()
    a = await Replica(redis_url, namespace, heartbeat=0.05, clock=clock).start()
    b = await Replica(redis_url, namespace).start()
    try:
        await a.shared.place(_decision(a, "w2", (3,), 5.0, []))
        clock.now += 3.0  # past the claim window: its worker left before it went out
        await wait_until(lambda: b.ledgers.get("m") and b.ledgers["m"].get("w2") == 5.0)
        assert b.view("w2").inflight == 0 and b.shared.peer_flights == 0
    finally:
        await a.shared.close()
        await b.shared.close()


async def test_a_silent_peers_flights_expire(redis_url):
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    a = await Replica(redis_url, namespace, heartbeat=0.05).start()
    b = await Replica(redis_url, namespace, heartbeat=0.05, peer_timeout=1.0).start()
    try:
        flight = a.view("w1").begin([7, 8])
        a.shared.sent("m", "w1", flight)
        await wait_until(lambda: b.shared.peer_flights == 1, what="peer flight")
        await a.shared.close()  # a crash: no end is ever published
        await wait_until(lambda: b.shared.peer_flights == 0, what="expired")
        assert b.view("w1").inflight == 0 and not b.view("w1").inflight_keys
    finally:
        await a.shared.close()
        await b.shared.close()


async def test_without_redis_each_replica_counts_its_own_and_recovers(start_redis):
    server = start_redis()
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    a = await Replica(server.url, namespace, heartbeat=0.05, timeout=0.3).start()
    b = await Replica(server.url, namespace, heartbeat=0.05, timeout=0.3).start()
    try:
        flight = a.view("w1").begin([1, 2])
        a.shared.sent("m", "w1", flight)
        await wait_until(lambda: b.shared.peer_flights == 1, what="peer flight")
        server.stop()
        await wait_until(lambda: not b.shared.following, what="channel lost")
        assert b.shared.peer_flights == 0 and b.view("w1").inflight == 0  # local only now
        seen: list[int] = []
        assert await a.shared.place(_decision(a, "w2", (5,), 1.0, seen)) == "w2"  # local-only
        later = _send(a, "w2", (5,))  # nobody hears it: dropped, A's own count stands
        await wait_until(lambda: a.shared.dropped >= 1, what="dropped")
        assert a.view("w2").inflight == 1 and seen == [1]
        server.start()
        await wait_until(lambda: a.shared.following and b.shared.following, what="back")
        again = a.view("w1").begin([3])
        a.shared.sent("m", "w1", again)
        await wait_until(lambda: b.shared.peer_flights == 1, what="sharing again")
        a.shared.finished(later)  # a flight B never saw start: ignored there
        a.shared.finished(again)
        await wait_until(lambda: b.shared.peer_flights == 0, what="ended")
        assert b.view("w2").inflight == 0
    finally:
        await a.shared.close()
        await b.shared.close()


def test_share_load_needs_the_redis_and_defaults_to_local():
    with pytest.raises(ConfigError, match="--share-load needs --redis-url") as info:
        RoutingConfig(workers=("127.0.0.1:1",), share_load=True)
    assert info.value.field == "redis-url"
    assert isinstance(RoutingConfig(workers=("127.0.0.1:1",)).make_shared_load(), LocalLoad)
    config = RoutingConfig(workers=("127.0.0.1:1",), share_load=True, redis_url="redis://h:1/0")
    assert isinstance(config.make_shared_load(), RedisSharedLoad)


async def test_replicas_on_a_cluster_share_through_any_node(redis_cluster):
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    urls = redis_cluster.urls()
    a = await Replica(urls[0], namespace).start()
    b = await Replica(urls[-1], namespace).start()
    try:
        flight = a.view("w2").begin([4, 5, 6])
        a.shared.sent("m", "w2", flight)
        await wait_until(lambda: b.view("w2").inflight == 1, what="peer flight via the bus")
        await asyncio.sleep(0)
    finally:
        await a.shared.close()
        await b.shared.close()


def test_the_shared_figures_are_on_the_routers_metrics():
    config = RoutingConfig(workers=("127.0.0.1:1",), share_load=True, redis_url="redis://h:1/0")
    service = RoutingService(config)
    names = {m.name for m in service.metrics_registry.collect()}
    for name in (
        "following",
        "peer_flights",
        "changes_dropped",
        "concurrent_decisions",
        "reconciled",
        "balanced",
    ):
        assert f"tokenkeys_router_replica_{name}" in names
    assert (
        service.metrics_registry.get_sample_value(
            "tokenkeys_router_replica_concurrent_decisions_total", {"kind": "split"}
        )
        == 0.0
    )


def test_only_decisions_neither_side_had_seen_are_counted():
    """The contention count over stream positions alone: own placements the peer had seen
    (at or before its ``seen``) and those appended after the peer's entry are not this
    replica's to count; the ones in between are, split or piled by what they placed."""
    clock = Clock()
    c = Contention(clock=clock)
    old = c.decided("m", "w1", (1, 2), (1, 2))
    c.appended([old], b"10-0")  # seen by the peer below
    mid = [c.decided("m", "w1", (1, 2), (1, 2)), c.decided("m", "w1", (5,), (5,))]
    c.appended(mid, b"20-0")  # after the peer's seen, before its entry: concurrent
    late = c.decided("m", "w2", (1, 2), (1, 2))
    c.appended([late], b"40-0")  # after the peer's entry: the peer counts that pair
    unsent = c.decided("m", "w2", (1, 2), (1, 2))  # not appended yet: also the peer's
    assert unsent.at is None
    # The peer placed prompt (1, 2, 3) on w2, new there, having seen up to 15-0; entry 30-0.
    assert c.peer_placed("m", "w2", [1, 2, 3], [1, 2, 3], b"15-0", (30, 0)) == 2
    assert (c.concurrent, c.split, c.split_blocks, c.piled) == (2, 1, 2, 0)
    # A new prompt on w1, sharing nothing with (5,): piled with it; (1, 2) shares nothing.
    assert c.peer_placed("m", "w1", [9], [9], b"15-0", (31, 0)) == 2
    assert (c.concurrent, c.split, c.piled) == (4, 1, 2)
    clock.now += 60.0  # past the window: nothing is kept to compare
    assert c.peer_placed("m", "w1", [9], [9], b"0-0", (50, 0)) == 0


def test_only_replicas_sharing_their_load_place_new_prompts_by_rendezvous():
    """The precise policy gives a prompt new everywhere the cost model's slack only beside
    peers (``Placements.replicated``): one router, or replicas that share nothing, take the
    cheapest worker as before (router.policy.cost)."""
    assert RedisSharedLoad("redis://h:1/0", namespace="t").replicated is True
    assert LocalLoad().replicated is False
    assert LocalPlacements().replicated is False
