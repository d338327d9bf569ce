"""llm-d request keys: values and byte dumps recorded in reference/engines/llm-d.md §1.2-1.6.

Those values were computed with llm-d-router's Go code (fxamacker/cbor + hash/fnv, and
cespare/xxhash); llm-d-router's own tests (token_processor_test.go) pin none, they only test
determinism and uniqueness.
"""

from __future__ import annotations

import json

import cbor2
import pytest

from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.keys import Adapter, KeyContext, MMItem, block_keys, make_spec
from tokenkeys.keys.compute import reference_block_keys
from tokenkeys.keys.llmd import fnv1a64

from conformance_data import data_path

# Every test here twice: through the compiled key core and the pure-Python paths.
pytestmark = pytest.mark.usefixtures("key_core")

CBOR_FNV = "llmd/cbor-fnv64@0.10"
XXH64 = "llmd/xxh64@c027acf"
TOKENS_16 = list(range(1, 17))
TOKENS_32 = list(range(1, 33))


def keys(profile_id: str, tokens: list[int], seed: str = "", **ctx: object) -> list[int]:
    spec = make_spec(profile_id, 16, root_seed=seed, vectors=False)
    context = KeyContext(**{"model": "test-model", **ctx})
    fast = block_keys(tokens, spec, context)
    assert fast == reference_block_keys(tokens, spec, context)
    return [k.event_key for k in fast]


def test_init_hash_and_byte_dumps() -> None:
    assert make_spec(CBOR_FNV, 16).root_hex == f"{14695981039346656037:016x}"
    assert make_spec(CBOR_FNV, 16, root_seed="42").root_hex == f"{571532774284038691:016x}"
    assert make_spec(XXH64, 16).root_hex == f"{17241709254077376921:016x}"
    root_cbor = cbor2.dumps([14695981039346656037, None, "test-model"], canonical=True)
    assert root_cbor.hex() == "831bcbf29ce484222325f66a746573742d6d6f64656c"
    assert fnv1a64(root_cbor) == 17515353698173365712
    block0 = cbor2.dumps([17515353698173365712, TOKENS_16, None], canonical=True)
    assert block0.hex() == "831bf31309635ef2add090" + bytes(TOKENS_16).hex() + "f6"
    mm = cbor2.dumps([1, TOKENS_16, [{"Hash": "abc123"}]], canonical=True)
    assert mm.hex() == "830190" + bytes(TOKENS_16).hex() + "81a16448617368" + "66616263313233"


def test_cbor_fnv_keys() -> None:
    assert keys(CBOR_FNV, TOKENS_16) == [9540012594951042066]
    assert keys(CBOR_FNV, TOKENS_16, "42") == [3239622172847516705]
    mm = (MMItem("abc123", 2, 4),)
    assert keys(CBOR_FNV, TOKENS_32, mm_items=mm) == [13689762014330163860, 3869841369440076254]


def test_xxh64_keys() -> None:
    assert keys(XXH64, TOKENS_16) == [13553460584553255540]
    assert keys(XXH64, TOKENS_16, "42") == [9464999881402841487]
    mm = (MMItem("abc123", 2, 4),)
    assert keys(XXH64, TOKENS_32, mm_items=mm) == [9643808326564029811, 17824264768090899893]


def test_golden_prompt_with_model_and_adapter() -> None:
    data = json.loads(data_path("vectors", "vllm-kv-events", "kv_event_base.json").read_text())
    spec = make_spec(CBOR_FNV, 16, root_seed="42")
    base = block_keys(data["token_ids"], spec, KeyContext(model="Qwen/Qwen3-0.6B"))
    assert (base[0].event_key, base[-1].event_key) == (12153654422267818227, 3809804460949024921)
    # The adapter name replaces the model name in the root (llm-d-router pool.go, PR #243).
    lora = block_keys(
        data["token_ids"], spec, KeyContext(model="Qwen/Qwen3-0.6B", adapter=Adapter("Alice"))
    )
    assert (lora[0].event_key, lora[-1].event_key) == (1973163393810978988, 9348551726086990967)


def test_salt_is_an_extra_of_block_zero_only() -> None:
    spec = make_spec(CBOR_FNV, 16, vectors=False)
    plain = block_keys(TOKENS_32, spec, KeyContext(model="m"))
    salted = block_keys(TOKENS_32, spec, KeyContext(model="m", cache_salt="s"))
    mm = block_keys(TOKENS_32, spec, KeyContext(model="m", mm_items=(MMItem("s", 0, 1),)))
    assert salted == mm and salted[0] != plain[0]


def test_refusals() -> None:
    spec = make_spec(CBOR_FNV, 16)
    with pytest.raises(InvalidArgument, match="context.model"):
        block_keys(TOKENS_16, spec)
    with pytest.raises(Unsupported, match="prompt embeddings"):
        block_keys(TOKENS_16, spec, KeyContext(model="m", prompt_embeds_digests=(bytes(32),)))
    with pytest.raises(InvalidArgument, match="root_seed"):
        make_spec(CBOR_FNV, 16, root_hex="00")
    with pytest.raises(Unsupported, match="one KV-cache group"):
        make_spec(CBOR_FNV, 16, groups=[16, 32])


def test_model_is_required_on_every_call() -> None:
    """required_context is ["model"] without conditions: also with an adapter or a parent."""
    spec = make_spec(CBOR_FNV, 16)
    assert spec.required_context == ("model",)
    parent = block_keys(TOKENS_32, spec, KeyContext(model="m"))[0]
    for ctx in (KeyContext(adapter=Adapter("Alice")), KeyContext(parent=parent.digest)):
        with pytest.raises(InvalidArgument, match="context.model"):
            block_keys(TOKENS_16, spec, ctx)
    # With an adapter the model is required but not hashed: its name takes the model's place.
    a = block_keys(TOKENS_16, spec, KeyContext(model="m", adapter=Adapter("Alice")))
    b = block_keys(TOKENS_16, spec, KeyContext(model="other", adapter=Adapter("Alice")))
    assert a == b


def test_group_index_not_in_the_spec_is_invalid() -> None:
    spec = make_spec(CBOR_FNV, 16)
    assert block_keys(TOKENS_16, spec, KeyContext(model="m", group=0))
    with pytest.raises(InvalidArgument, match="group 1 is not in this spec"):
        block_keys(TOKENS_16, spec, KeyContext(model="m", group=1))
