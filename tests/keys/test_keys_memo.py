"""ChainMemo returns exactly block_keys' keys: every profile, shared prefixes, budget resets."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tokenkeys.errors import ConfigError, InvalidArgument, TokenkeysError
from tokenkeys.keys import Adapter, KeyContext, MMItem, block_keys, make_spec
from tokenkeys.keys.memo import ChainMemo
from tokenkeys.keys.registry import profile_ids


def _spec(profile_id: str):
    seed = {"root_seed": "9"} if profile_id.startswith("vllm/xxhash") else {}
    return make_spec(profile_id, 4, vectors=False, **seed)


def _contexts(spec) -> list[KeyContext]:
    """The empty context, a salted one and an adapter one, where the profile takes them."""
    base = KeyContext(model="m") if "model" in spec.required_context else KeyContext()
    out = [base]
    for ctx in (replace(base, cache_salt="s"), replace(base, adapter=Adapter("a", "/p/a"))):
        try:
            block_keys(list(range(8)), spec, ctx)
        except TokenkeysError:
            continue  # the profile refuses that context: so does the memo (tested below)
        out.append(ctx)
    return out


@pytest.mark.parametrize("profile_id", profile_ids())
def test_memo_equals_block_keys_on_growing_conversations(profile_id: str) -> None:
    spec = _spec(profile_id)
    memo = ChainMemo(spec, max_entries=40)  # small: resets happen along the way
    rng = random.Random(profile_id)
    for ctx in _contexts(spec):
        prompt: list[int] = []
        for _turn in range(12):
            prompt = prompt + [rng.randrange(50) for _ in range(rng.randrange(1, 11))]
            branch = prompt[: rng.randrange(len(prompt) + 1)] + [rng.randrange(50)]
            for tokens in (prompt, branch, prompt):
                assert memo.block_keys(tokens, ctx) == block_keys(tokens, spec, ctx)
    assert memo.hits > 0 and memo.resets > 0 and memo.entries <= 40


def test_memo_refuses_what_block_keys_refuses() -> None:
    spec = _spec("vllm/sha256_cbor@0.31")
    memo = ChainMemo(spec, max_entries=100)
    memo.block_keys(list(range(8)))
    bad = KeyContext(adapter=Adapter("a"))  # tagged era: the path is required
    with pytest.raises(InvalidArgument) as want:
        block_keys(list(range(8)), spec, bad)
    with pytest.raises(InvalidArgument) as got:
        memo.block_keys(list(range(8)), bad)
    assert got.value.message == want.value.message
    with pytest.raises(InvalidArgument):
        memo.block_keys([1, -1, 2, 3])
    with pytest.raises(ConfigError):
        ChainMemo(spec, max_entries=0)


def test_position_dependent_contexts_bypass_the_memo() -> None:
    spec = _spec("vllm/sha256_cbor@0.31")
    memo = ChainMemo(spec, max_entries=100)
    ctx = KeyContext(mm_items=(MMItem("img", 5, 3),))
    tokens = list(range(16))
    assert memo.block_keys(tokens, ctx) == block_keys(tokens, spec, ctx)
    assert memo.entries == 0
