"""The Router core over three simulated engines: follow-up turns go where their prefix is."""

from __future__ import annotations

import pytest
import xxhash
from routing_support import SYSTEM, collect, routed, start_cluster

from tokenkeys.errors import InvalidArgument
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.policy.placement import LocalPlacements
from tokenkeys.router.policy.precise import PrecisePolicy
from tokenkeys.router.policy.router import POLICIES, make_policy
from tokenkeys.router.routed_engine import RouteNote, current_note

# Every decision here through the compiled ranking and through the Python path (conftest).
pytestmark = pytest.mark.usefixtures("rank_core")


def test_each_policy_name_makes_its_own_object_and_an_unknown_one_is_refused():
    index = MemoryPrefixIndex()
    made = [make_policy(name, index) for name in POLICIES]
    assert [p.name for p in made] == ["precise", "round_robin", "text_chunks"]
    assert len({type(p) for p in made}) == 3  # each owns its state: no shared object
    with pytest.raises(InvalidArgument) as refused:
        make_policy("random", index)
    assert refused.value.field == "policy" and "precise, round_robin, text_chunks" in str(
        refused.value.message
    )


async def run_conversations(cluster, conversations: int, turns: int, *, shared: bool = True):  # noqa: ANN001, ANN201, E501
    """Each conversation: system + user turns, assistant replies from the engine.

    ``shared``: one system prompt for all; otherwise each conversation's starts differently.

    Returns per conversation the list of (decision, usage) of its turns.
    """
    pool = next(iter(cluster.registry.pools.values()))
    engine = cluster.engine()

    def system(c: int) -> str:
        return SYSTEM if shared else f"Desk {c} of {conversations}. {SYSTEM}"

    history = {c: [{"role": "system", "content": system(c)}] for c in range(conversations)}
    out: dict[int, list] = {c: [] for c in range(conversations)}
    for t in range(turns):
        for c in range(conversations):
            messages = history[c] + [
                {"role": "user", "content": f"Conversation {c}, turn {t}: next train to Elm?"}
            ]
            ids = pool.preprocessor.tokenize_chat({"messages": messages}).tokens.ids
            note = RouteNote()
            token = current_note.set(note)
            try:
                tokens, last = await collect(engine, ids)
            finally:
                current_note.reset(token)
            (decision,) = note.decisions
            assert note.served_by == [decision.worker]
            reply = pool.preprocessor.detokenize([tokens], skip_special_tokens=True)[0]
            history[c] = messages + [{"role": "assistant", "content": reply}]
            out[c].append((decision, last.usage, ids))
        await cluster.settle()
    return out


def rendezvous(keys: list[int], workers: list[str]) -> str:
    salt = keys[0].to_bytes(8, "little")
    return max(workers, key=lambda w: xxhash.xxh64_intdigest(salt + w.encode()))


async def test_follow_up_turns_land_on_the_worker_holding_their_prefix(settings, tmp_path):
    cluster = await start_cluster(3, settings=settings)
    try:
        pool = next(iter(cluster.registry.pools.values()))
        turns = await run_conversations(cluster, conversations=4, turns=4, shared=False)
        # The very first prompt ties everywhere (score 0, no load, empty caches): it goes to
        # the worker with the highest hash of (its first block key, worker), as every router
        # replica would choose.
        decision, _, ids = turns[0][0]
        assert decision.reason == "load"
        assert decision.worker == rendezvous(await pool.block_keys(ids), cluster.addresses)
    finally:
        await cluster.close()
    for history in turns.values():  # Every follow-up stays where its prefix is.
        first = history[0][0].worker
        for decision, usage, _ in history[1:]:
            assert decision.worker == first, history
            assert decision.reason == "prefix"
            assert decision.matched_blocks > 0
            assert usage.cached_prompt_tokens >= decision.matched_blocks * 16 - 16


async def test_precise_routing_caches_more_prompt_tokens_than_round_robin(settings):
    cached = {}
    for policy in ("precise", "round_robin"):
        cluster = await start_cluster(3, settings=settings, policy=policy)
        try:
            turns = await run_conversations(cluster, conversations=4, turns=4)
        finally:
            await cluster.close()
        cached[policy] = sum(u.cached_prompt_tokens for h in turns.values() for _, u, _ in h)
    assert cached["precise"] > cached["round_robin"]


async def test_a_spec_the_router_cannot_compute_is_keyed_by_the_engine(settings):
    """vLLM's pickle-based sha256 is not client-computable: the pool keys prompts remotely
    (ComputeCacheKeys) and routing by prefix works the same."""
    cluster = await start_cluster(3, settings=settings, profile="vllm/sha256@0.31")
    try:
        pool = next(iter(cluster.registry.pools.values()))
        assert pool.strategy.decision.mode == "remote"
        assert "not client-computable" in pool.strategy.decision.reason
        turns = await run_conversations(cluster, conversations=3, turns=3, shared=False)
    finally:
        await cluster.close()
    for history in turns.values():
        for decision, usage, _ in history[1:]:
            assert decision.worker == history[0][0].worker and decision.reason == "prefix"
            assert usage.cached_prompt_tokens > 0


class ReplicatedPlacements(LocalPlacements):
    """Decisions stand as made, as beside peers that have not heard of them yet."""

    replicated = True


@pytest.mark.parametrize("replicated", [False, True])
async def test_beside_peers_a_new_prompt_goes_to_its_rendezvous_worker_within_the_slack(
    settings, replicated
):
    """A first new prompt goes to its rendezvous worker (all tie) and grows its cache there.
    A second new prompt of about the same size whose rendezvous worker is that same one: one
    router sends it to a cheaper worker (the growth there costs); beside peers it follows its
    hash within the slack (one such prompt), as every replica deciding it at that instant
    would, whatever else each had placed."""
    index = MemoryPrefixIndex()
    placements = ReplicatedPlacements() if replicated else LocalPlacements()
    policy = PrecisePolicy(index, placements=placements)
    cluster = await start_cluster(3, settings=settings, index=index, policy=policy)
    try:
        pool = next(iter(cluster.registry.pools.values()))

        async def ids_of(c: int) -> tuple[list[int], str]:
            messages = [{"role": "system", "content": f"Desk {c}. {SYSTEM}"}]
            ids = pool.preprocessor.tokenize_chat({"messages": messages}).tokens.ids
            return ids, rendezvous(await pool.block_keys(ids), cluster.addresses)

        first_ids, home = await ids_of(0)
        decision = (await routed(cluster, first_ids))[0]
        assert decision.worker == home
        await cluster.settle()
        # The next desk whose prompt hashes to the same worker (a new prompt: no block of it
        # is cached anywhere, its first block differs).
        second_ids = next(ids for ids, h in [await ids_of(c) for c in range(1, 40)] if h == home)
        second = (await routed(cluster, second_ids))[0]
        assert second.matched_blocks == 0
        assert (second.worker == home) is replicated
    finally:
        await cluster.close()
