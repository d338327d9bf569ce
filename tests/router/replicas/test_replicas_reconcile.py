"""Router replicas bringing one new prompt placed on two workers back to one worker.

Real parts: two router replicas (``RouterProcess``, the precise policy, ``--share-load``) over
one real Redis, two simulated engines on loopback gRPC. Two conversations opening with one
new prompt are decided in one turn of the event loop, one by each replica (neither hears the
other first, as in the first round of bench_routing's concurrent workload); one replica's
decision is pinned to the other worker (``RouteRequest.workers``), so the prompt is split.
The engines hold each request after its prefill (a gate on the simulated engine's prefill:
its blocks are cached, its first output waits), so whether a request has had its first
output is the test's choice, never a race.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgpack
import pytest
import redis.asyncio
from engine_stack import EngineStack, start_stack
from routing_support import SYSTEM, engine_models, wait_until

from tokenkeys.engine.protocol import GenerateOutput
from tokenkeys.router.assembly import RouterProcess, RouterProcessConfig
from tokenkeys.router.policy.decision import RouteRequest
from tokenkeys.router.policy.placement import Home
from tokenkeys.router.replicas.moves import Moved, unless_moved
from tokenkeys.router.replicas.reconcile import Reconciler, beyond
from tokenkeys.router.replicas.shared_load import RedisSharedLoad
from tokenkeys.router.replicas.shared_stream import FINISHED, PLACED, entry_id, stream_key
from tokenkeys.router.routed_engine import RouteNote, current_note
from tokenkeys.router.service import RoutingConfig
from tokenkeys.router.workers.load_view import Flight


class Gate:
    """Holds a simulated engine's requests after their prefill until opened."""

    def __init__(self, stack: EngineStack) -> None:
        self.open = asyncio.Event()
        engine = stack.local().engine
        prefill = engine._prefill

        async def gated(*args: object) -> float:
            ttft = await prefill(*args)  # the prompt's blocks are cached (and told) here
            await self.open.wait()
            return ttft

        engine._prefill = gated  # type: ignore[method-assign]


@dataclass
class Pool:
    stacks: list[EngineStack]
    gates: list[Gate]
    replicas: list[RouterProcess]
    namespace: str

    def shared(self, i: int) -> RedisSharedLoad:
        shared = self.replicas[i].service.shared
        assert isinstance(shared, RedisSharedLoad)
        return shared

    def moves(self, i: int) -> Reconciler:
        return self.shared(i).reconciler


@pytest.fixture
async def pool(redis_url: str) -> AsyncIterator[Pool]:
    stacks = [await start_stack(models=engine_models()) for _ in range(2)]
    gates = [Gate(s) for s in stacks]
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    config = RoutingConfig(
        workers=tuple(s.target for s in stacks),
        poll_interval=0.2,
        timeout=1.0,
        redis_url=redis_url,
        redis_namespace=namespace,
        share_load=True,
    )
    replicas = [await RouterProcess(RouterProcessConfig(config)).start() for _ in range(2)]
    made = Pool(stacks, gates, replicas, namespace)
    try:
        for i in range(2):
            await wait_until(lambda i=i: made.shared(i).following, what="following")
            await wait_until(
                lambda i=i: len(made.replicas[i].service.router.pool(None).members) == 2,
                what="both workers ready",
            )
        yield made
    finally:
        for gate in gates:
            gate.open.set()
        for replica in replicas:
            await replica.stop()
        for stack in stacks:
            await stack.stop()


def _ids(pool: Pool, text: str) -> list[int]:
    return pool.replicas[0].service.router.pool(None).preprocessor.tokenize_prompts([text])[0].ids


class Client:
    """One request through one replica, read output by output."""

    def __init__(self, pool: Pool, replica: int, ids: list[int], only: str | None = None):
        self.pool, self.replica, self.ids, self.only = pool, replica, ids, only
        self.note = RouteNote()
        self.outputs: list[GenerateOutput] = []
        self.first = asyncio.Event()

    async def run(self) -> None:
        service = self.pool.replicas[self.replica].service
        token = current_note.set(self.note)
        try:
            if self.only is not None:  # this replica's decision, pinned to one worker
                request = RouteRequest(self.ids, None, workers=frozenset({self.only}))
                self.note.preset = await service.router.route(request)
            async for output in service.engine().generate(self.ids):
                self.outputs.append(output)
                self.first.set()
        finally:
            current_note.reset(token)

    @property
    def decided(self) -> str:
        return self.note.decisions[0].worker

    @property
    def served(self) -> str:
        return self.note.served_by[0]

    @property
    def tokens(self) -> list[int]:
        return [t for o in self.outputs for t in o.token_ids]


async def _placements(url: str, namespace: str) -> list[tuple[tuple[int, int], str, str]]:
    """(entry, replica, worker) of every placement in the stream, in its order."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        raw = await client.xrange(stream_key(namespace))
    finally:
        await client.aclose()
    out = []
    for raw_id, fields in raw:
        replica, changes = msgpack.unpackb(fields[b"d"])
        out += [(entry_id(raw_id), replica, c[3]) for c in changes if c[0] == PLACED]
    return out


def _split(pool: Pool, ids: list[int]) -> tuple[Client, Client]:
    """The prompt through replica 0 to worker 0 and through replica 1 to worker 1."""
    return tuple(Client(pool, i, ids, only=pool.stacks[i].target) for i in range(2))  # type: ignore[return-value]


async def _direct(pool: Pool, address: str, ids: list[int]) -> list[int]:
    """The prompt's answer from ``address`` itself, no router between."""
    service = pool.replicas[0].service
    engine = service.registry.engine(address, service.router.pool(None).name)
    out: list[int] = []
    async for output in engine.generate(ids):
        out.extend(output.token_ids)
    return out


async def test_the_later_copy_moves_to_the_earlier_ones_worker_before_its_first_output(
    pool: Pool, redis_url: str
):
    ids = _ids(pool, SYSTEM + "Which trains leave Alder before noon?")
    a, b = _split(pool, ids)
    tasks = [asyncio.create_task(c.run()) for c in (a, b)]  # decided in one turn of the loop
    keys = await pool.replicas[0].service.router.pool(None).block_keys(ids)
    model = pool.replicas[0].service.router.pool(None).name

    def claims() -> list[str | None]:
        return [pool.moves(i).claimant(model, keys[0]) for i in range(2)]

    # Both replicas read both placements (the stream's order) while both requests wait.
    await wait_until(lambda: None not in claims(), what="both replicas read both entries")
    first, later = sorted(await _placements(redis_url, pool.namespace))[:2]
    assert first[2] != later[2], "the two placements were on two workers"
    # Both replicas name the earlier placement's worker for the prompt's first block.
    assert claims() == [first[2], first[2]]
    await wait_until(lambda: pool.moves(0).moved + pool.moves(1).moved == 1, what="a move")
    for gate in pool.gates:
        gate.open.set()
    await asyncio.gather(*tasks)

    replicas = {pool.shared(i).replica: i for i in range(2)}
    earlier_i, later_i = replicas[first[1]], replicas[later[1]]
    clients = {0: a, 1: b}
    earlier, moved = clients[earlier_i], clients[later_i]
    # The earlier copy stays where it was decided; the later one is served there too.
    assert earlier.served == earlier.decided == first[2]
    assert moved.decided == later[2] and moved.served == first[2]
    assert pool.moves(later_i).moved == 1 and pool.moves(earlier_i).moved == 0
    assert pool.moves(0).late == pool.moves(1).late == 0
    # Moved, it found the earlier copy's prefill there, as one router's second request does.
    usage = moved.outputs[-1].usage
    assert usage is not None and usage.cached_prompt_tokens >= 16 * (len(ids) // 16 - 1)
    # The client's answer is the one the earlier copy's worker gives, and the other's too.
    assert moved.tokens == earlier.tokens == await _direct(pool, first[2], ids)
    assert moved.tokens == await _direct(pool, later[2], ids)
    # The routers count the attempt left as moved (tokenkeys_router_requests_total).
    metrics = pool.replicas[later_i].service.metrics.requests
    assert metrics.labels(later[2], "moved")._value.get() == 1


async def test_a_later_copy_past_its_first_output_stays_where_it_is(pool: Pool, redis_url: str):
    """Each replica sends the prompt and sees its first output in one turn of the loop, before
    any entry can be read (what the routed engine does around a request that answers faster
    than the peers' entries arrive: ``sent``, ``moves``, ``answered``)."""
    ids = _ids(pool, SYSTEM + "Is there a night train from Elm to Fir?")
    model = pool.replicas[0].service.router.pool(None).name
    keys = await pool.replicas[0].service.router.pool(None).block_keys(ids)
    moves = []
    for i in range(2):
        member = pool.replicas[i].service.router.pool(None).members[pool.stacks[i].target]
        flight = member.view.begin(keys)
        pool.shared(i).sent(model, member.address, flight)
        moves.append(pool.shared(i).moves(flight))
        member.view.first_output(flight)
        pool.shared(i).answered(flight)
    first, later = sorted(await _placements_when(redis_url, pool.namespace, 2))[:2]
    replicas = {pool.shared(i).replica: i for i in range(2)}
    await wait_until(
        lambda: pool.moves(replicas[later[1]]).late == 1, what="the later copy found late"
    )
    assert all(m is not None and not m.done() for m in moves)  # nobody is told to move
    assert pool.moves(0).moved == pool.moves(1).moved == 0
    await wait_until(
        lambda: all(pool.moves(i).claimant(model, keys[0]) == first[2] for i in range(2)),
        what="both replicas naming the earlier placement's worker",
    )
    assert pool.moves(replicas[first[1]]).late == 0


async def _placements_when(url: str, namespace: str, count: int) -> list:
    """The stream's placements once it holds ``count`` of them."""
    found: list = []

    async def enough() -> bool:
        found[:] = await _placements(url, namespace)
        return len(found) >= count

    await wait_until(enough, what=f"{count} placements in the stream")
    return found


def _flight(keys: tuple[int, ...]) -> Flight:
    return Flight(keys, keys, 0.0, own=True)


async def test_the_rule_applies_to_the_streams_order_alone():
    """The same entries in the same order give the same claims on every replica, whichever
    sent them; a later copy decided knowing the claim (its ``seen`` at or after it) stays."""
    workers = {"x", "y"}
    one = Reconciler("r1", lambda m, a: object() if a in workers else None)
    two = Reconciler("r2", lambda m, a: object() if a in workers else None)
    keys = [7, 8, 9]
    placed_x = [PLACED, 1, "m", "x", keys, keys, 3.0, "0-0"]
    placed_y = [PLACED, 1, "m", "y", keys, keys, 3.0, "0-0"]
    knowing = [PLACED, 2, "m", "y", keys, keys, 3.0, "5-0"]

    one.sent(1, "m", _flight(tuple(keys)))
    two.sent(1, "m", _flight(tuple(keys)))
    two.sent(2, "m", _flight(tuple(keys)))
    stays, moves, knew = one.movable(1), two.movable(1), two.movable(2)
    for reconciler in (one, two):
        reconciler.entry("r1", [placed_x], (5, 0))
        reconciler.entry("r2", [placed_y], (6, 0))
        reconciler.entry("r2", [knowing], (7, 0))
    assert stays is not None and moves is not None and knew is not None
    assert not stays.done() and not knew.done() and moves.result() == "x"
    assert one.claimant("m", 7) == two.claimant("m", 7) == "x"
    # The request ends where it was moved from: counted once, as moved.
    two.finished(1)
    assert (two.moved, two.late, one.moved) == (1, 0, 0)


async def test_a_claim_ends_with_its_request_or_after_the_window():
    now = [0.0]
    one = Reconciler("r1", lambda m, a: object(), window=10.0, clock=lambda: now[0])
    keys = [7, 8]
    one.entry("r2", [[PLACED, 1, "m", "x", keys, keys, 2.0, "0-0"]], (5, 0))
    assert one.claimant("m", 7) == "x"
    one.entry("r2", [[FINISHED, 1]], (6, 0))
    assert one.claimant("m", 7) is None  # its request ended: the next placement claims
    one.entry("r2", [[PLACED, 2, "m", "y", keys, keys, 2.0, "6-0"]], (7, 0))
    assert one.claimant("m", 7) == "y"
    now[0] = 10.5  # its end never told (a change Redis did not take): gone after the window
    one.entry("r3", [[PLACED, 1, "m", "z", [9], [9], 1.0, "7-0"]], (8, 0))
    assert one.claimant("m", 7) is None and one.claimant("m", 9) == "z"


async def test_a_move_found_in_the_instant_of_the_answer_wins_and_releases_it():
    loop = asyncio.get_running_loop()
    move: asyncio.Future[str] = loop.create_future()
    move.set_result("x")
    answer: asyncio.Future[str] = loop.create_future()
    answer.set_result("the answer's open head")
    released: list[str] = []
    with pytest.raises(Moved) as moved:
        await unless_moved(answer, move, released.append)
    assert moved.value.worker == "x" and released == ["the answer's open head"]
    # No move: the answer as it came, nothing released.
    pending: asyncio.Future[str] = loop.create_future()
    again: asyncio.Future[str] = loop.create_future()
    again.set_result("answer")
    assert await unless_moved(again, pending, released.append) == "answer"
    assert released == ["the answer's open head"]


# ------------------------------------------------------------- the stream's order balances


def _balancing(replica: str, workers: tuple[str, ...] = ("w0", "w1")) -> Reconciler:
    return Reconciler(
        replica, lambda m, a: object() if a in workers else None, workers=lambda m: workers
    )


def _placed(serial: int, worker: str, keys: list[int], seen: str = "0-0", movable: int = 1) -> list:
    return [PLACED, serial, "m", worker, keys, keys, 1.0, seen, movable]


def _burst(one: Reconciler, two: Reconciler, second: list[list]) -> None:
    """r1's entry (two new prompts on w0), then r2's, both decided before either was read."""
    first = [_placed(1, "w0", [10, 11, 12, 13], "4-0"), _placed(2, "w0", [20, 21, 22, 23], "4-0")]
    for reconciler in (one, two):
        reconciler.entry("r1", first, (5, 0))
        reconciler.entry("r2", second, (6, 0))


async def test_a_burst_decided_apart_is_balanced_by_the_streams_order():
    """r2 put a new prompt on w0 without knowing r1's two there: every replica claims it for
    w1, and r2, its sender, moves it there; r1 moves nothing."""
    one, two = _balancing("r1"), _balancing("r2")
    for r in (one, two):
        r.sent(1, "m", _flight((10, 11, 12, 13)))
    one.sent(2, "m", _flight((20, 21, 22, 23)))
    r1_first, r1_second, r2_first = one.movable(1), one.movable(2), two.movable(1)
    _burst(one, two, [_placed(1, "w0", [30, 31, 32, 33], "4-0")])
    assert one.claimant("m", 30) == two.claimant("m", 30) == "w1"
    assert r2_first is not None and r2_first.result() == "w1"
    assert r1_first is not None and r1_second is not None
    assert not r1_first.done() and not r1_second.done()
    assert (two.balanced, one.balanced) == (1, 0)


@pytest.mark.parametrize(
    "why",
    ["decided knowing the peer's", "its sender cannot move it", "under half a prompt apart"],
)
async def test_a_new_prompt_stays_where_its_sender_put_it(why: str):
    one, two = _balancing("r1"), _balancing("r2")
    two.sent(1, "m", _flight((30, 31, 32, 33)))
    move = two.movable(1)
    seen, movable, keys = "4-0", 1, [30, 31, 32, 33]
    if why == "decided knowing the peer's":
        seen = "5-0"  # r1's entry was read when r2 decided: its own cost model chose w0
    elif why == "its sender cannot move it":
        movable = 0  # a streamed answer through the front door
    else:
        # w1 already holds 3 blocks against w0's 8: moving 20 blocks of r2's would not even it.
        keys = list(range(30, 50))
        for r in (one, two):
            r.entry("r3", [_placed(1, "w1", [90, 91, 92], "0-0")], (4, 0))
    _burst(one, two, [_placed(1, "w0", keys, seen, movable)])
    assert one.claimant("m", keys[0]) == two.claimant("m", keys[0]) == "w0"
    assert move is not None and not move.done() and two.balanced == 0


async def test_one_senders_conversations_of_a_new_prompt_move_together():
    """r2 opened one new prompt twice on w0, where r1 put two: both go to w1."""
    one, two = _balancing("r1"), _balancing("r2")
    keys = [30, 31, 32, 33]
    for serial in (1, 2):
        two.sent(serial, "m", _flight(tuple(keys)))
    moves = [two.movable(s) for s in (1, 2)]
    _burst(one, two, [_placed(1, "w0", keys, "4-0"), _placed(2, "w0", keys, "4-0")])
    assert one.claimant("m", 30) == two.claimant("m", 30) == "w1"
    assert [m.result() for m in moves if m is not None] == ["w1", "w1"]


async def test_an_entrys_copies_of_earlier_prompts_count_before_its_new_ones():
    """r1 opened A on w0 and B on w1; r2, blind to both, opened C on w0 and a copy of A with
    eight blocks of its own on w1. The copy counts on A's w0 before C is claimed, so C goes to
    w1 (twelve blocks against eight); counted after it, C would stay on w0 and the copy join it
    (sixteen against four)."""
    one, two = _balancing("r1"), _balancing("r2")
    a, b, c = [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]
    copy = [*a, *range(14, 22)]
    for serial, keys in ((1, c), (2, copy)):
        two.sent(serial, "m", _flight(tuple(keys)))
    new, moved = two.movable(1), two.movable(2)
    for r in (one, two):
        r.entry("r1", [_placed(1, "w0", a), _placed(2, "w1", b)], (5, 0))
        r.entry("r2", [_placed(1, "w0", c, "4-0"), _placed(2, "w1", copy, "4-0")], (6, 0))
        assert (r.held.of("m", "w0"), r.held.of("m", "w1")) == (12, 8)
    assert one.claimant("m", 30) == two.claimant("m", 30) == "w1"
    assert new is not None and moved is not None
    assert (new.result(), moved.result()) == ("w1", "w0")


async def test_a_copy_counts_only_the_blocks_past_its_prompt():
    """r1 opened A on w0 and B on w1; r2, blind to both, opened a copy of A (one block of its
    own, all five to compute where r2 decided) and a new C, both on w0. The copy brings one
    block to w0's cache, so w0 holds five against w1's four and C stays with its sender's
    choice; counted whole (nine against four) it would be moved to w1. Which copies a burst
    shows first is chance: counted whole, they would push the new prompts off the workers whose
    copies came first onto those whose copies come later."""
    one, two = _balancing("r1"), _balancing("r2")
    a, b, c = [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]
    two.sent(1, "m", _flight(tuple(c)))
    new = two.movable(1)
    for r in (one, two):
        r.entry("r1", [_placed(1, "w0", a), _placed(2, "w1", b)], (5, 0))
        r.entry("r2", [_placed(1, "w0", c, "4-0"), _placed(2, "w0", [*a, 14], "4-0")], (6, 0))
        assert (r.held.of("m", "w0"), r.held.of("m", "w1")) == (9, 4)
        assert r.claimant("m", 30) == "w0"
    assert new is not None and not new.done() and two.balanced == 0


async def test_one_senders_conversations_of_a_prompt_weigh_its_blocks_once():
    """r2 opened one new prompt of eight blocks twice on w0 (the second conversation one block
    of its own) where r1 holds six: the pair brings nine blocks, six apart is at least half of
    them, and both move to w1. Weighed whole (sixteen) they would stay."""
    one, two = _balancing("r1"), _balancing("r2")
    first, second = list(range(30, 38)), [*range(30, 37), 99]
    for serial, keys in ((1, first), (2, second)):
        two.sent(serial, "m", _flight(tuple(keys)))
    moves = [two.movable(s) for s in (1, 2)]
    for r in (one, two):
        r.entry("r1", [_placed(1, "w0", list(range(10, 16)))], (5, 0))
        r.entry("r2", [_placed(1, "w0", first, "4-0"), _placed(2, "w0", second, "4-0")], (6, 0))
        assert r.claimant("m", 30) == "w1"
    assert [m.result() for m in moves if m is not None] == ["w1", "w1"]


async def test_a_balanced_claim_follows_its_request_to_its_worker():
    """The first attempt's end keeps the claim; the moved attempt holds it; its end ends it."""
    one, two = _balancing("r1"), _balancing("r2")
    _burst(one, two, [_placed(1, "w0", [30, 31, 32, 33], "4-0")])
    for r in (one, two):
        r.entry("r2", [[FINISHED, 1]], (7, 0))  # cancelled to be moved
        assert r.claimant("m", 30) == "w1"
        r.entry("r2", [_placed(2, "w1", [30, 31, 32, 33], "6-0", 0)], (7, 1))
        assert r.claimant("m", 30) == "w1"
        # A later copy decided before any of it follows it there, not to where it was first.
        r.entry("r3", [_placed(1, "w0", [30, 31, 32, 33], "4-0")], (8, 0))
        assert r.claimant("m", 30) == "w1"
        r.entry("r3", [[FINISHED, 1]], (8, 1))
        assert r.claimant("m", 30) == "w1"
        r.entry("r2", [[FINISHED, 2]], (9, 0))
        assert r.claimant("m", 30) is None


@pytest.mark.parametrize("why", ["its replica fell silent", "its end was lost"])
async def test_a_placement_no_longer_held(why: str):
    """r1 placed two prompts on w0 and never told their end: once r1 is silent for longer than
    ``silence``, or the placements are older than ``hold`` (r1 alive), a new prompt of r2 on
    w0 stays where r2 put it (nothing held there any more)."""
    two = Reconciler(
        "r2", lambda m, a: object(), workers=lambda m: ("w0", "w1"), silence=5.0, hold=60.0
    )
    first = [_placed(1, "w0", [10, 11, 12, 13]), _placed(2, "w0", [20, 21, 22, 23])]
    two.entry("r1", first, (1_000, 0))
    later = 7_000 if why == "its replica fell silent" else 62_000
    if why == "its end was lost":
        for ms in range(2_000, later, 2_000):  # r1's signs of life
            two.entry("r1", [[9, 0]], (ms, 0))
    two.entry("r2", [[9, 0]], (later, 0))
    two.entry("r2", [_placed(1, "w0", [30, 31, 32, 33], "0-0")], (later + 1, 0))
    assert two.claimant("m", 30) == "w0" and two.balanced == 0
    # Within both bounds the same placement is balanced away from w0.
    fresh = Reconciler("r2", lambda m, a: object(), workers=lambda m: ("w0", "w1"))
    fresh.entry("r1", first, (1_000, 0))
    fresh.entry("r2", [_placed(1, "w0", [30, 31, 32, 33], "0-0")], (1_001, 0))
    assert fresh.claimant("m", 30) == "w1"


async def test_a_moved_prompt_has_a_home_every_replica_knows():
    """A later copy moved to the claim's worker, and a balanced claim, each leave their prompt
    cached where their first attempt ran too: every replica names the worker they went to, for
    a next turn whose matched blocks end where that prompt ended or after it."""
    one, two = _balancing("r1"), _balancing("r2")
    copy = [10, 11, 12, 13, 14]  # r2's copy of r1's prompt [10, 11, 12, 13], its own last block
    _burst(one, two, [_placed(1, "w1", copy, "4-0"), _placed(2, "w0", [30, 31, 32, 33], "4-0")])
    for r in (one, two):
        # The copy went to the claim's w0 from w1, where its sender computed all of it.
        assert r.homes.find("m", [*copy, 15, 16], 5) == Home("w0", "w1", 0)
        assert r.homes.find("m", [30, 31, 32, 33, 34], 4) == Home("w1", "w0", 0)  # balanced
        # A match past the prompt's end (its answer, made by both attempts) finds it too.
        assert r.homes.find("m", [*copy, 15, 16], 7) == Home("w0", "w1", 0)
        assert r.homes.find("m", [*copy, 15, 16], 4) is None  # no moved prompt ends by block 4
        assert r.homes.find("m", [10, 11, 12, 13], 4) is None  # r1's claim itself never moved
        assert r.homes.find("m", copy, 0) is None


@pytest.mark.parametrize(
    ("keys", "other", "past"),
    [([1, 2, 3], [1, 2, 9], 1), ([1, 2], [1, 2, 3], 0), ([1, 2, 3], [1], 2), ([5], [6], 1)],
)
def test_beyond_counts_the_keys_past_the_common_prefix(keys: list, other: list, past: int):
    assert beyond(keys, other) == past
