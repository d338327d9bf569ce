"""KeyContext validation (cache salt as vLLM 0.33 validate_cache_salt, multimodal items)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys.errors import InvalidArgument
from tokenkeys.keys import Adapter, KeyContext, MMItem
from tokenkeys.keys.context import items_overlapping


@pytest.mark.parametrize("salt", ["", "a@b", "a/b", "a\\b", "a\x00b", "x" * 129, 5])
def test_cache_salt_refused_like_vllm(salt: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        KeyContext(cache_salt=salt)  # type: ignore[arg-type]
    assert info.value.field == "cache_salt"


@pytest.mark.parametrize("salt", ["t", "x" * 128, "tenant-a:b c", "é" * 128])
def test_cache_salt_accepted_like_vllm(salt: str) -> None:
    assert KeyContext(cache_salt=salt).cache_salt == salt


def test_mm_items_sorted_and_non_overlapping() -> None:
    KeyContext(mm_items=(MMItem("a", 0, 4), MMItem("b", 4, 1)))
    with pytest.raises(InvalidArgument, match="must not overlap"):
        KeyContext(mm_items=(MMItem("a", 0, 4), MMItem("b", 3, 1)))
    with pytest.raises(InvalidArgument, match="sorted"):
        KeyContext(mm_items=(MMItem("b", 5, 1), MMItem("a", 0, 1)))
    with pytest.raises(InvalidArgument, match="length 0"):
        MMItem("a", 0, 0)
    with pytest.raises(InvalidArgument, match="integer"):
        MMItem("a", 1.0, 2)  # type: ignore[arg-type]


def test_negative_mm_offset_only_after_a_parent() -> None:
    # An item that began before a continuation's first token keeps its true (negative) start.
    item = MMItem("a", -3, 5)
    with pytest.raises(InvalidArgument, match="parent") as info:
        KeyContext(mm_items=(item,))
    assert info.value.field == "mm.offset"
    ctx = KeyContext(mm_items=(item, MMItem("b", 2, 1)), parent=bytes(32))
    assert ctx.mm_items[0].offset == -3
    with pytest.raises(InvalidArgument, match="must not overlap"):
        KeyContext(mm_items=(item, MMItem("b", 1, 1)), parent=bytes(32))
    with pytest.raises(InvalidArgument, match="parent"):
        KeyContext.from_dict({"mm_items": [{"identifier": "a", "offset": -1, "length": 2}]})


def test_other_fields() -> None:
    with pytest.raises(InvalidArgument, match="32 bytes"):
        KeyContext(prompt_embeds_digests=(b"short",))
    with pytest.raises(InvalidArgument, match="parent"):
        KeyContext(parent=b"")
    with pytest.raises(InvalidArgument, match="adapter.name"):
        Adapter("")
    with pytest.raises(InvalidArgument, match="unknown key context field"):
        KeyContext.from_dict({"salt": "x"})


def test_overlap_rule() -> None:
    items = (MMItem("a", 5, 20), MMItem("b", 32, 16))
    assert [m.identifier for m in items_overlapping(items, 0, 16)] == ["a"]
    assert [m.identifier for m in items_overlapping(items, 16, 32)] == ["a"]
    assert [m.identifier for m in items_overlapping(items, 32, 48)] == ["b"]
    assert items_overlapping(items, 48, 64) == []


contexts = st.builds(
    KeyContext,
    model=st.none() | st.text(min_size=1, max_size=5),
    adapter=st.none() | st.builds(Adapter, st.text(min_size=1, max_size=5)),
    cache_salt=st.none() | st.sampled_from(["s", "tenant"]),
    mm_items=st.just((MMItem("x", 1, 2),)) | st.just(()),
    prompt_embeds_digests=st.just(()) | st.just((bytes(32),)),
    group=st.none() | st.integers(0, 3),
    parent=st.none() | st.binary(min_size=1, max_size=32),
)


@given(contexts)
def test_dict_round_trip(ctx: KeyContext) -> None:
    assert KeyContext.from_dict(ctx.to_dict()) == ctx
