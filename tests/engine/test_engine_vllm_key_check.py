"""The live key check places every stored block by its parent and tokens, as the engine hashes it.

The "engine" here is tokenkeys' own vLLM profile (what vLLM 0.32 publishes, as
``tests/realengine/test_vllm_keys.py`` proves against vLLM itself), or the same profile under
another root seed, algorithm or salt when a test wants the engine to disagree. Events are built
as vLLM's scheduler publishes them: one ``BlockStored`` per step holding only the blocks it
newly cached, chained to the last cached block by ``parent_block_hash``. The same situations
against a real vLLM: ``tests/realengine/test_vllm_sidecar.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import random

from prometheus_client import CollectorRegistry

from tokenkeys.engine.simulated.event_extra_keys import VllmEventExtraKeys
from tokenkeys.engine.vllm.key_check import KeyCheck, keys_checked
from tokenkeys.events.model import BlockRemoved, BlockStored, EventBatch
from tokenkeys.keys import Adapter, KeyContext, MMItem, block_keys, make_spec

BS = 16
SPEC = make_spec("vllm/sha256_cbor@0.31", BS)


def _check(limit: int | None = None) -> tuple[KeyCheck, CollectorRegistry]:
    registry = CollectorRegistry()
    if limit is None:
        return KeyCheck(SPEC, "m", keys_checked(registry)), registry
    return KeyCheck(SPEC, "m", keys_checked(registry), limit=limit), registry


def _counts(registry: CollectorRegistry) -> tuple[float, float]:
    def one(result: str) -> float:
        labels = {"model": "m", "result": result}
        return registry.get_sample_value("tokenkeys_engine_keys_checked_total", labels) or 0.0

    return one("match"), one("mismatch")


def _stored(
    tokens: list[int],
    first: int = 0,
    blocks: int | None = None,
    spec=SPEC,  # noqa: ANN001
    context: KeyContext | None = None,
) -> EventBatch:
    """The event vLLM publishes when it newly caches blocks ``first .. first+blocks``."""
    keys = block_keys(tokens, spec, context)
    end = len(keys) if blocks is None else first + blocks
    chosen = keys[first:end]
    extra = VllmEventExtraKeys(BS)
    extras = tuple(extra(context, i * BS, (i + 1) * BS) for i in range(first, end))
    event = BlockStored(
        tuple(k.event_key for k in chosen),
        keys[first - 1].event_key if first else None,
        tuple(tokens[first * BS : end * BS]),
        BS,
        lora_name=context.adapter.name if context and context.adapter else None,
        extra_keys=extras if any(e is not None for e in extras) else None,
    )
    return EventBatch(0.0, (event,))


def _tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(49152) for _ in range(length)]


def test_a_prompt_stored_in_two_steps_matches_block_by_block() -> None:
    check, registry = _check()
    prompt = _tokens(1, 5 * BS + 9)
    assert check.expect(prompt, None) == 5
    check.observe(_stored(prompt, 0, 2))
    check.observe(_stored(prompt, 2))  # the tail, chained to block 1 by its parent hash
    assert _counts(registry) == (5, 0)
    assert check.verified


def test_many_identical_blocks_in_one_prompt_and_across_prompts() -> None:
    # A repeated paragraph: 40 identical blocks in one prompt, then 30 other prompts that hold
    # the same block at different positions. Each is placed by its parent, so none is lost.
    check, registry = _check()
    block = _tokens(2, BS)
    prompts = [block * 40] + [_tokens(100 + i, (i % 5) * BS) + block * 3 for i in range(30)]
    for prompt in prompts:
        check.expect(prompt, None)
    for prompt in prompts:
        check.observe(_stored(prompt))
    expected = sum(len(p) // BS for p in prompts)
    assert _counts(registry) == (expected, 0)


def test_a_prefix_cached_earlier_places_the_tail_vllm_stores() -> None:
    # vLLM stores only the new tail of a prompt whose prefix it cached for an earlier request:
    # the tail's parent is the engine hash of the last cached block.
    check, registry = _check()
    system = _tokens(3, 4 * BS)
    first, follow_up = system + _tokens(4, 2 * BS + 3), system + _tokens(5, 3 * BS)
    check.expect(first, None)
    check.observe(_stored(first))
    check.expect(follow_up, None)
    check.observe(_stored(follow_up, 4))
    assert _counts(registry) == (6 + 3, 0)


def test_a_prompt_ending_on_a_block_boundary() -> None:
    check, registry = _check()
    prompt = _tokens(6, 3 * BS)
    assert check.expect(prompt, None) == 3
    check.observe(_stored(prompt))
    assert _counts(registry) == (3, 0)


def test_generated_tokens_completing_a_block_count_neither_way() -> None:
    # The block vLLM stores for generated tokens has a placed parent but tokens no prompt held.
    check, registry = _check()
    prompt = _tokens(7, 2 * BS + 10)
    check.expect(prompt, None)
    check.observe(_stored(prompt))
    generated = prompt + _tokens(8, 6)
    check.observe(_stored(generated, 2))
    assert _counts(registry) == (2, 0)


def test_interleaved_events_of_concurrent_requests() -> None:
    # Chunked prefill of four requests in one scheduler: each request's blocks arrive in order
    # (vLLM caches a block only after its parent), the requests' events interleave at random.
    check, registry = _check()
    prompts = [_tokens(10 + i, 4 * BS) for i in range(4)]
    for prompt in prompts:
        check.expect(prompt, None)
    pending = [[_stored(p, step, 1) for step in range(4)] for p in prompts]
    rng = random.Random(0)
    while any(pending):
        check.observe(rng.choice([q for q in pending if q]).pop(0))
    assert _counts(registry) == (16, 0)


def test_eviction_and_re_store() -> None:
    check, registry = _check()
    prompt = _tokens(20, 3 * BS)
    check.expect(prompt, None)
    stored = _stored(prompt)
    check.observe(stored)
    hashes = stored.events[0].block_hashes
    check.observe(EventBatch(0.0, (BlockRemoved(hashes[1:]),)))
    check.expect(prompt, None)
    check.observe(_stored(prompt, 1))
    assert _counts(registry) == (5, 0)


def test_lora_and_cache_salt_place_blocks_under_their_own_keys() -> None:
    check, registry = _check()
    prompt = _tokens(30, 3 * BS)
    contexts = [
        None,
        KeyContext(cache_salt="tenant-a"),
        KeyContext(cache_salt="tenant-b"),
        KeyContext(adapter=Adapter("sql", "/adapters/sql")),
    ]
    for ctx in contexts:
        check.expect(prompt, ctx)
    for ctx in contexts:
        check.observe(_stored(prompt, context=ctx))
    assert _counts(registry) == (12, 0)


def test_a_block_stored_under_an_unexpected_salt_is_not_placed() -> None:
    # Same tokens, another salt (a request that bypassed the sidecar): not a block we placed.
    check, registry = _check()
    prompt = _tokens(31, 2 * BS)
    check.expect(prompt, None)
    check.observe(_stored(prompt, context=KeyContext(cache_salt="other")))
    assert _counts(registry) == (0, 0)
    assert check.verified


def test_a_parent_stored_before_the_sidecar_joined_places_nothing() -> None:
    check, registry = _check()
    prompt = _tokens(40, 4 * BS)
    check.expect(prompt[2 * BS :], None)  # what is known is another prompt's tokens
    check.observe(_stored(prompt, 2))
    assert _counts(registry) == (0, 0)


def test_a_restarted_engine_with_the_same_seed_still_matches() -> None:
    check, registry = _check()
    prompt = _tokens(50, 3 * BS)
    for _ in range(2):  # the restarted vLLM stores the whole prompt again
        check.expect(prompt, None)
        check.observe(_stored(prompt))
    assert _counts(registry) == (6, 0)


def test_forgotten_blocks_count_neither_way() -> None:
    check, registry = _check(limit=8)
    prompts = [_tokens(60 + i, 2 * BS) for i in range(10)]
    for prompt in prompts:
        check.expect(prompt, None)
    for prompt in prompts:
        check.observe(_stored(prompt))
    matched, mismatched = _counts(registry)
    assert mismatched == 0 and 0 < matched < 20


def test_a_wrong_root_seed_is_flagged_on_the_first_prompt_of_two_blocks(caplog) -> None:
    check, registry = _check()
    engine_spec = make_spec("vllm/sha256_cbor@0.31", BS, root_seed="0")  # PYTHONHASHSEED=0
    prompt = _tokens(70, 2 * BS)
    with caplog.at_level(logging.ERROR, logger="tokenkeys.engine.vllm.key_check"):
        check.expect(prompt, None)
        check.observe(_stored(prompt, spec=engine_spec))
        second = _tokens(71, 3 * BS)
        check.expect(second, None)
        check.observe(_stored(second, spec=engine_spec))
    assert _counts(registry) == (0, 5)
    assert not check.verified
    assert len(caplog.records) == 1
    assert "root seed" in caplog.records[0].getMessage()


def test_a_later_block_mismatch_names_the_algorithm() -> None:
    # The first block published as tokenkeys keys it, the next by another algorithm.
    check, registry = _check()
    prompt = _tokens(80, 3 * BS)
    check.expect(prompt, None)
    check.observe(_stored(prompt, 0, 1))
    other = make_spec("vllm/sha256@0.31", BS)
    keys = block_keys(prompt, SPEC)
    theirs = block_keys(prompt, other)
    event = BlockStored((theirs[1].event_key,), keys[0].event_key, tuple(prompt[BS : 2 * BS]), BS)
    check.observe(EventBatch(0.0, (event,)))
    assert _counts(registry) == (1, 1)
    assert check.first_mismatch is not None and "algorithm" in check.first_mismatch


# Image blocks (issue 35): the extra keys hold the image's identifier. A prompt of random text
# then an image: blocks 0-1 are text, the image's placeholders run from token 2*BS + 5 on.
IMAGE_AT = 2 * BS + 5


def _image_context(identifier: str) -> KeyContext:
    return KeyContext(mm_items=(MMItem(identifier, IMAGE_AT, 3 * BS),))


def test_image_blocks_match_under_the_identifier() -> None:
    check, registry = _check()
    prompt = _tokens(90, 6 * BS)
    context = _image_context("a" * 64)
    check.expect(prompt, context, owned_from=2)
    check.observe(_stored(prompt, context=context))
    assert _counts(registry) == (6, 0) and check.verified


def test_another_identifier_on_a_shared_prefix_is_another_clients_image() -> None:
    # Same text, same placeholder tokens, another image: vLLM stores the blocks under another
    # identifier. Not the sidecar's request as far as it can know: counted neither way.
    check, registry = _check()
    prompt = _tokens(91, 6 * BS)
    check.expect(prompt, _image_context("a" * 64))
    check.observe(_stored(prompt, context=_image_context("b" * 64)))
    assert _counts(registry) == (2, 0) and check.verified


def test_another_identifier_in_an_owned_prompt_is_flagged() -> None:
    # The start probe's prompt: only it can store blocks after its random block 1, so vLLM's
    # other identifier there is a wrong one (a --mm-model-id that is not vLLM's --model).
    check, registry = _check()
    prompt = _tokens(92, 6 * BS)
    check.expect(prompt, _image_context("a" * 64), owned_from=2)
    check.observe(_stored(prompt, context=_image_context("b" * 64)))
    assert _counts(registry) == (2, 4)  # every image block
    assert not check.verified
    assert check.first_mismatch is not None and "image identifier" in check.first_mismatch


def test_a_tampered_identifier_with_the_right_hash_is_flagged() -> None:
    # An event whose hashes are tokenkeys' but whose published extra keys name another image.
    check, registry = _check()
    prompt = _tokens(93, 6 * BS)
    context = _image_context("a" * 64)
    check.expect(prompt, context, owned_from=2)
    (event,) = _stored(prompt, context=context).events
    assert isinstance(event, BlockStored) and event.extra_keys is not None
    tampered = tuple(
        tuple(("c" * 64, off) for _, off in extra) if extra else extra for extra in event.extra_keys
    )
    check.observe(EventBatch(0.0, (dataclasses.replace(event, extra_keys=tampered),)))
    assert _counts(registry) == (2, 4) and not check.verified
    assert "image identifier" in (check.first_mismatch or "")
