"""Router replicas sharing their requests in flight and cache growth through a real Redis.

Two :class:`RedisSharedLoad` instances stand for two replicas; each applies the other's
stream entries to its own load views, and their decisions are placed through the stream.
The pools are stand-ins holding only what the shared load touches (``members[address].view``,
a real ``LoadView``): the pool machinery (discovery, artifacts) plays no part here and is
tested in ``test_router_pool.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio
from routing_support import wait_until

from tokenkeys.errors import ConfigError
from tokenkeys.router.policy.cost import GrowthLedger
from tokenkeys.router.policy.placement import Placement
from tokenkeys.router.replicas.shared_load import LocalLoad, RedisSharedLoad
from tokenkeys.router.service import RoutingConfig
from tokenkeys.router.workers.load_view import LoadView


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


def _placing(replica: Replica, address: str, keys: tuple[int, ...], growth: float, seen: list):
    """A decision that always picks ``address``, noting what it saw of the peer's flights."""

    def decide() -> tuple[Placement, str]:
        seen.append(replica.view("w1").inflight + replica.view("w2").inflight)
        fresh = replica.view(address).fresh(keys)
        return Placement("m", address, keys, fresh, growth), address

    return decide


async def test_a_placement_reaches_every_replica_once(replicas):
    a, b = replicas
    seen: list[int] = []
    assert await a.shared.place(_placing(a, "w2", (4, 5, 6), 12.0, seen)) == "w2"
    await wait_until(lambda: b.view("w2").inflight == 1, what="placed flight")
    assert "m" in b.ledgers and b.ledgers["m"].get("w2") == 12.0  # the placement's growth
    # Own placements are not replayed here (the policy records their growth itself); the
    # placement is held in A's view until its request goes out.
    assert a.ledgers["m"].get("w2") == 0.0 and a.view("w2").inflight == 1
    assert b.view("w2").queued_prefill(frozenset()) == 3
    # The request of that decision takes the placement over: no second flight at A or B.
    flight = a.view("w2").begin((4, 5, 6))
    assert a.view("w2").inflight == 1 and flight.fresh == (4, 5, 6)
    a.shared.sent("m", "w2", flight)
    a.shared.finished(flight)
    await wait_until(lambda: b.shared.peer_flights == 0, what="placed flight ended")
    assert b.view("w2").inflight == 0 and seen == [0]


async def test_concurrent_decisions_are_made_again_on_the_peers_placement(replicas):
    a, b = replicas
    seen_a: list[int] = []
    seen_b: list[int] = []
    # Both decide on the same memory before either round trip: the second one placed finds
    # the first's entry, applies it and decides again.
    picked = await asyncio.gather(
        a.shared.place(_placing(a, "w1", (1, 2), 2.0, seen_a)),
        b.shared.place(_placing(b, "w1", (1, 2), 2.0, seen_b)),
    )
    assert picked == ["w1", "w1"]
    assert a.shared.redecided + b.shared.redecided == 1
    again = seen_a if len(seen_a) == 2 else seen_b
    assert sorted([len(seen_a), len(seen_b)]) == [1, 2] and again == [0, 1]
    assert a.shared.forced == b.shared.forced == 0


async def test_decisions_asked_together_are_placed_in_one_round_trip(replicas, redis_url):
    """Decisions a replica is asked while it places do not queue one round trip each: they
    are decided in order, each held in the replica's view so the next one sees it, and placed
    in one entry."""
    a, b = replicas
    seen: list[int] = []
    picked = await asyncio.gather(
        *(a.shared.place(_placing(a, "w1", (10 + i,), 1.0, seen)) for i in range(3))
    )
    assert picked == ["w1"] * 3 and seen == [0, 1, 2] and a.shared.redecided == 0
    assert a.view("w1").inflight == 3 and a.ledgers["m"].get("w1") == 0.0
    await wait_until(lambda: b.view("w1").inflight == 3, what="three placed flights")
    admin = redis.asyncio.Redis.from_url(redis_url)
    try:
        stream = await admin.xrange(a.shared.key)
    finally:
        await admin.aclose()
    mine = [f for _, f in stream if f[b"r"] == a.shared.replica.encode() and f[b"p"] == b"1"]
    assert len(mine) == 1


async def test_a_refused_placement_withdraws_its_hold(replicas):
    a, b = replicas
    await asyncio.gather(
        a.shared.place(_placing(a, "w1", (1, 2), 2.0, [])),
        b.shared.place(_placing(b, "w1", (1, 2), 2.0, [])),
    )
    # Each holds its own placement once and counts the peer's: a refused attempt's hold
    # (the second placed decided twice) is gone.
    await wait_until(
        lambda: a.view("w1").inflight == b.view("w1").inflight == 2, what="both placements"
    )
    assert [len(r.view("w1").holds[(1, 2)]) for r in (a, b)] == [1, 1]
    assert not a.ledgers["m"].held and not b.ledgers["m"].held


async def test_a_placement_no_request_takes_up_is_withdrawn(redis_url):
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    clock = Clock()
    a = await Replica(redis_url, namespace, heartbeat=0.05, clock=clock).start()
    b = await Replica(redis_url, namespace).start()
    try:
        await a.shared.place(_placing(a, "w2", (3,), 1.0, []))
        await wait_until(lambda: b.view("w2").inflight == 1, what="placed flight")
        assert a.view("w2").inflight == 1
        clock.now += 3.0  # past the claim window: its worker left before it went out
        await wait_until(lambda: a.view("w2").inflight == 0, what="hold withdrawn")
        await wait_until(lambda: b.view("w2").inflight == 0, what="ended for the peer")
        assert not a.view("w2").holds and a.view("w2").request_seconds is None
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
        assert await a.shared.place(_placing(a, "w2", (5,), 1.0, seen)) == "w2"  # local-only
        later = a.view("w2").begin([5])
        a.shared.sent("m", "w2", later)  # nobody hears it: dropped, A's own count stands
        await wait_until(lambda: a.shared.dropped >= 2, what="dropped")
        assert a.view("w2").inflight == 1 and seen == [1] and not a.shared.place_seconds
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


async def test_a_placement_cancelled_in_its_round_trip_leaves_no_flight(replicas, redis_url):
    """The client that a decision was for left while it was placed: its hold goes here once
    the round trip ends, and the peers end its flight if the placement reached the stream."""
    a, b = replicas
    admin = redis.asyncio.Redis.from_url(redis_url)
    # Writes (the placing script among them) wait while the server is paused: the round trip
    # is still out when the task is cancelled.
    await admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
    try:
        task = asyncio.create_task(a.shared.place(_placing(a, "w1", (8, 9), 3.0, [])))
        await wait_until(lambda: a.view("w1").inflight == 1, what="held while placed")
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()
    # Its round trip ends (placed, or failed): the hold goes either way.
    await wait_until(
        lambda: a.view("w1").inflight == 0 and not a.ledgers["m"].held, what="hold withdrawn"
    )
    flight = a.view("w2").begin((5,))
    a.shared.sent("m", "w2", flight)  # a later entry: B has read past the cancelled one's end
    await wait_until(lambda: b.view("w2").inflight == 1, what="a later flight")
    assert b.view("w1").inflight == 0
