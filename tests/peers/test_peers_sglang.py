"""``sglang/sha256@0.5.23`` against SGLang's released code: the ``sglang`` 0.5.23 wheel.

* Page hashes: ``sglang.srt.mem_cache.utils.get_hash_str`` (the C++ page hash of
  ``cpp_utils/hash_binding.cpp``, over the token buffers the radix tree passes it: a list,
  ``array('I')`` or ``array('q')``) and the Rust tree's ``get_hash_str``, with and without a
  prior page digest, and ``hash_str_to_int64`` for the event form, on random tokens and page
  sizes.
* Radix-tree events: prompts sharing prefixes are inserted into one tree, and the tree emits
  the ``BlockStored`` events SGLang's ZMQ publisher sends (default event format), with and
  without a cache salt and a request ``extra_key``. Both trees of 0.5.23: the Rust TreeCore
  binding (the default ``UnifiedRadixCache``'s) and ``KVCacheEventRecorder.record_store`` (the
  Python ``RadixCache``'s).
  Every published hash, parent hash and token page must be tokenkeys' key of that page, and
  tokenkeys' event decoder (``VllmMsgpackCodec``, what the router ingests with) must read the
  same hashes from SGLang's own msgpack payload.
  The Python tree is a stand-in (``drivers/sglang_driver.py`` says why); its hashing, salt
  seed, node-split hash bookkeeping and event recording are SGLang's.
"""

from __future__ import annotations

import base64
import random

import pytest
from random_inputs import length, seed, text, token_ids

from tokenkeys.events.model import BlockStored
from tokenkeys.events.vllm_codec import VllmMsgpackCodec
from tokenkeys.keys import KeyContext, block_keys, make_spec

pytestmark = pytest.mark.peers

CASES = 300
PAGE_SIZES = (1, 2, 3, 8, 16, 32, 64)


def specs() -> dict[int, object]:
    return {ps: make_spec("sglang/sha256@0.5.23", ps, vectors=False) for ps in PAGE_SIZES}


def test_keys_equal_sglang_page_hashes_on_random_tokens(sglang_peer) -> None:
    run_seed = seed()
    rng = random.Random(run_seed)
    cases = []
    for _ in range(CASES):
        page_size = rng.choice(PAGE_SIZES)
        cases.append(
            {
                "tokens": token_ids(rng, length(rng, page_size)),
                "page_size": page_size,
                "typecode": rng.choice((None, "I", "q")),
                "prior_hex": rng.randbytes(32).hex() if rng.random() < 0.3 else None,
            }
        )
    answers = sglang_peer.call("pages", cases=cases)
    by_size = specs()
    compared = 0
    for i, (case, answer) in enumerate(zip(cases, answers, strict=True)):
        where = f"seed {run_seed} case {i}: {case}"
        prior = bytes.fromhex(case["prior_hex"]) if case["prior_hex"] else None
        keys = block_keys(case["tokens"], by_size[case["page_size"]], parent=prior)
        # SGLang also hashes a partial last page; the radix tree never stores one (page_size
        # > 1 keys are page-aligned), and tokenkeys keys full blocks only.
        full = len(case["tokens"]) // case["page_size"]
        assert [k.hex for k in keys] == answer["hashes"][:full], where
        assert [k.hex for k in keys] == answer["rust_hashes"][:full], where
        assert [k.event_key for k in keys] == answer["int64"][:full], where
        compared += full
    assert compared > CASES


def prompt_family(rng: random.Random, page_size: int) -> list[list[int]]:
    """Prompts that share prefixes the way chat turns and agent branches do: a base, then
    prompts that extend an earlier one, branch off it mid-way (splitting its node), or repeat
    a prefix of it."""
    prompts = [token_ids(rng, length(rng, page_size, max_blocks=5) + page_size)]
    for _ in range(rng.randint(1, 4)):
        earlier = rng.choice(prompts)
        keep = rng.randrange(len(earlier) + 1)
        tail = token_ids(rng, length(rng, page_size, max_blocks=3))
        prompts.append(earlier[:keep] + tail)
    return prompts


def shared_pages(a: list[int], b: list[int], page_size: int) -> int:
    """Whole pages ``a`` and ``b`` have in common from the start: what the tree already holds."""
    pages = 0
    while (pages + 1) * page_size <= min(len(a), len(b)):
        page = slice(pages * page_size, (pages + 1) * page_size)
        if a[page] != b[page]:
            break
        pages += 1
    return pages


@pytest.mark.parametrize("tree", ["rust", "python"])
def test_keys_equal_sglang_radix_tree_events(sglang_peer, tree: str) -> None:
    run_seed = seed()
    rng = random.Random(run_seed + 1)
    cases = []
    for _ in range(CASES // 3):
        page_size = rng.choice(PAGE_SIZES)
        cases.append(
            {
                "page_size": page_size,
                "prompts": prompt_family(rng, page_size),
                "cache_salt": text(rng) if rng.random() < 0.5 else None,
                # A request's own extra_key namespaces the tree, not the published hashes.
                "extra_key": text(rng) if rng.random() < 0.3 else None,
            }
        )
    answers = sglang_peer.call("events", tree=tree, cases=cases)
    by_size = specs()
    published = 0
    for i, (case, per_prompt) in enumerate(zip(cases, answers, strict=True)):
        ps = case["page_size"]
        ctx = KeyContext(cache_salt=case["cache_salt"])
        for p, (prompt, answer) in enumerate(zip(case["prompts"], per_prompt, strict=True)):
            stored = answer["stored"]
            where = f"seed {run_seed} case {i} prompt {p}: {case}"
            pages = len(prompt) // ps
            keys = block_keys(prompt, by_size[ps], ctx)
            assert len(keys) == pages, where
            cached = max((shared_pages(prompt, q, ps) for q in case["prompts"][:p]), default=0)
            hashes = [h for event in stored for h in event["block_hashes"]]
            assert hashes == [k.event_key for k in keys[cached:]], where
            assert [t for e in stored for t in e["token_ids"]] == prompt[cached * ps : pages * ps]
            # Each event links to the page before its first one: the chain tokenkeys computes.
            expected_parent = keys[cached - 1].event_key if cached else None
            for event in stored:
                assert event["parent_block_hash"] == expected_parent, where
                assert event["block_size"] == ps and event["cache_salt"] == case["cache_salt"]
                expected_parent = event["block_hashes"][-1]
            # The same events as they go over the wire, decoded as the router decodes them.
            codec = VllmMsgpackCodec()
            decoded = codec.decode(base64.b64decode(answer["payload"])).events
            assert codec.stats.malformed_events == 0 and not codec.stats.unknown_types, where
            wire = [e for e in decoded if isinstance(e, BlockStored)]
            assert [
                (list(e.block_hashes), e.parent_block_hash, list(e.token_ids), e.block_size)
                for e in wire
            ] == [
                (e["block_hashes"], e["parent_block_hash"], e["token_ids"], e["block_size"])
                for e in stored
            ], where
            published += len(hashes)
    assert published > CASES // 3
