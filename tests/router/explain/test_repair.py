"""The repair's verdicts on short answers, in every order a worker's events can take.

A real :class:`RemovalLog` over a real memory index, fed by a real :class:`EventIngestor` with
the event batches an engine publishes; the repair request is recorded (the registry's resync
is proven in ``tests/router/workers/test_workers_resync.py`` and ``test_explain.py``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, SpecRef
from tokenkeys.router.explain.removals import RemovalLog
from tokenkeys.router.explain.repair import Repair, ShortAnswerCase
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.ingest.ingestor import EventIngestor

SPEC = SpecRef("vllm/sha256_cbor@0.31", "f" * 64)
WORKER = "127.0.0.1:9@m"
PROMPT = (11, 12, 13, 14)


def stored(*hashes: int, parent: int | None = None) -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=(), block_size=16)


def removed(*hashes: int) -> BlockRemoved:
    return BlockRemoved(block_hashes=hashes)


class Setup:
    """A removal log, its ingestor, a repair recording the repairs it asks for."""

    def __init__(self, *, stale_after: int = 2, pending: int = 16, history: int = 4096) -> None:
        self.log = RemovalLog(MemoryPrefixIndex(), history=history)
        self.ingestor = EventIngestor(self.log, SPEC)
        self.registry = CollectorRegistry()
        self.repairs: list[tuple[str, str, str]] = []
        self.repair = Repair(
            self.log,
            lambda *args: self.repairs.append(args),
            self.registry,
            stale_after=stale_after,
            pending=pending,
        )
        self.seq = 0

    async def events(self, *events: object) -> None:
        self.seq += 1
        await self.ingestor.apply(WORKER, EventBatch(float(self.seq), events, spec=SPEC))

    def routed(self) -> int:
        return self.log.tick(WORKER)

    def short(self, block: int, tick: int, keys: tuple[int, ...] = PROMPT, hybrid=False) -> None:
        case = ShortAnswerCase("127.0.0.1:9", "m", WORKER, block, keys[block], tick, hybrid)
        self.repair.short(case)

    def verdicts(self) -> dict[str, float]:
        out = {}
        for verdict in ("stale", "explained", "unresolved"):
            value = self.registry.get_sample_value(
                "tokenkeys_router_short_answers_total",
                {"worker": "127.0.0.1:9", "verdict": verdict},
            )
            out[verdict] = value or 0.0
        return {k: v for k, v in out.items() if v}


async def test_a_store_with_no_removal_since_the_routing_proves_the_index_stale():
    s = Setup()
    await s.events(stored(*PROMPT))
    tick = s.routed()
    s.short(2, tick)  # the engine did not hold block 2; nothing said so
    assert s.verdicts() == {}  # no verdict before the block is stored again
    await s.events(stored(13, 14, parent=12))  # computed anew
    assert s.verdicts() == {"stale": 1}


async def test_a_store_applied_before_the_answer_proves_it_too():
    s = Setup()
    await s.events(stored(*PROMPT))
    tick = s.routed()
    await s.events(stored(13, 14, parent=12))  # the answer came after the engine's events
    s.short(2, tick)
    assert s.verdicts() == {"stale": 1}


async def test_an_eviction_after_the_routing_explains_the_answer_whatever_its_timing():
    # The removal arrives before the store, before or after the answer: explained each time.
    for answer_first in (True, False):
        s = Setup()
        await s.events(stored(*PROMPT))
        tick = s.routed()
        if answer_first:
            s.short(2, tick)
        await s.events(removed(13, 14), stored(13, 14, parent=12))
        if not answer_first:
            s.short(2, tick)
        assert s.verdicts() == {"explained": 1}, answer_first
        assert s.repairs == []


async def test_a_removal_late_after_the_answer_still_explains_it():
    s = Setup()
    await s.events(stored(*PROMPT))
    tick = s.routed()
    s.short(1, tick)
    await s.events(removed(12))
    assert s.verdicts() == {}  # still awaiting the store
    await s.events(stored(12, parent=11))
    assert s.verdicts() == {"explained": 1}


async def test_a_clear_explains_and_voids_the_proofs_before_it():
    s = Setup()
    await s.events(stored(*PROMPT))
    tick = s.routed()
    s.short(3, tick)
    await s.events(AllBlocksCleared())
    assert s.verdicts() == {"explained": 1}
    # A proof, a clear (the index was rebuilt), a proof: not two since the clear.
    tick = s.routed()
    await s.events(stored(13, parent=12))
    s.short(2, tick)
    await s.events(AllBlocksCleared())
    tick = s.routed()
    await s.events(stored(14, parent=13))
    s.short(3, tick)
    assert s.verdicts() == {"explained": 1, "stale": 2}
    assert s.repairs == []


async def test_two_proofs_on_distinct_blocks_ask_for_one_repair():
    s = Setup()
    await s.events(stored(*PROMPT))
    tick = s.routed()
    await s.events(stored(12, parent=11))
    s.short(1, tick)
    s.short(1, tick)  # the same block again: one proof
    assert s.repairs == []
    tick = s.routed()
    await s.events(stored(14, parent=13))
    s.short(3, tick)
    assert s.repairs == [("127.0.0.1:9", "m", "stale_answers")]
    assert s.verdicts() == {"stale": 3}


async def test_on_a_hybrid_model_any_removal_since_the_routing_explains():
    s = Setup()
    await s.events(stored(*PROMPT))
    tick = s.routed()
    await s.events(removed(99), stored(13, parent=12))  # a window group's block, say
    s.short(2, tick, hybrid=True)
    assert s.verdicts() == {"explained": 1}


async def test_forgotten_history_and_a_full_queue_leave_cases_unresolved():
    s = Setup(history=2, pending=1)
    await s.events(stored(*PROMPT))
    tick = s.routed()
    # Two generations of three keys each past the bound of two: what came before is forgotten.
    await s.events(stored(21, 22, 23))
    await s.events(stored(31, 32, 33))
    s.short(2, tick)
    assert s.verdicts() == {"unresolved": 1}
    tick = s.routed()
    s.short(0, tick)
    s.short(1, tick)  # the queue holds one: the first is dropped
    assert s.verdicts() == {"unresolved": 2}
    await s.events(stored(12, parent=11))
    assert s.verdicts() == {"unresolved": 2, "stale": 1}
    assert s.log.awaited(WORKER) == 0
