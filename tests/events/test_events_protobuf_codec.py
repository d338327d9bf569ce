"""The OpenEngine protobuf codec: hash encodings, field defaults, and lossless round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys._gen.openengine.v1 import cache_keys_pb2, kv_pb2
from tokenkeys.errors import InvalidArgument
from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from tokenkeys.events.protobuf_codec import (
    ProtobufEventCodec,
    decode_hash,
    encode_hash,
    int_encoding_of,
)


def test_hash_encodings():
    h = 17911472383915781900  # >= 2**63: a vLLM u64 event key (vllm.md §4.2 example)
    msg = encode_hash(h, "uint64")
    assert (msg.value, msg.encoding) == (h.to_bytes(8, "big"), "uint64")
    assert decode_hash(msg) == h
    neg = encode_hash(-5, "int64")  # SGLang publishes signed int64
    assert neg.value == b"\xff" * 7 + b"\xfb" and decode_hash(neg) == -5
    raw = encode_hash(b"\x01" * 32, "uint64")
    assert raw.encoding == "bytes" and decode_hash(raw) == b"\x01" * 32
    with pytest.raises(InvalidArgument, match="negative"):
        encode_hash(-1, "uint64")
    with pytest.raises(InvalidArgument, match="engine_specific"):
        decode_hash(kv_pb2.KvBlockHash(value=b"x", encoding="engine_specific"))
    with pytest.raises(InvalidArgument, match="8"):
        decode_hash(kv_pb2.KvBlockHash(value=b"\x00" * 4, encoding="uint64"))
    assert int_encoding_of("i64_be_first8") == "int64"
    assert int_encoding_of("u64_be_last8") == "uint64"


def test_encoded_batch_fields():
    ref = cache_keys_pb2.CacheKeySpecRef(profile_id="p", spec_fingerprint="f" * 64)
    codec = ProtobufEventCodec(key_spec=ref)
    stored = BlockStored(
        (1, 2),
        None,
        tuple(range(32)),
        16,
        lora_id=3,
        medium="GPU",
        lora_name="sql",
        extra_keys=(("sql", "salt"), None),
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    msg = codec.encode(9, EventBatch(1.5, (stored, BlockRemoved((1,), "GPU", 0)), 0))
    assert (msg.sequence_number, msg.timestamp_unix_nanos) == (9, 1_500_000_000)
    assert msg.key_spec == ref
    bs = msg.events[0].block_stored
    assert not bs.HasField("parent_block_hash")
    assert (bs.lora_id, bs.lora_name, bs.medium) == (3, "sql", kv_pb2.STORAGE_MEDIUM_GPU)
    assert [list(e.values) for e in bs.extra_keys] == [['"sql"', '"salt"'], []]
    assert msg.events[1].block_removed.block_hashes[0].value == (1).to_bytes(8, "big")
    removed = BlockRemoved((1,), "GPU", 0)
    assert codec.decode(msg) == (9, EventBatch(1.5, (stored, removed), 0))


hashes = st.integers(0, 2**64 - 1)
opt_text = st.none() | st.text(min_size=1, max_size=8)
extra_entry = st.none() | st.tuples(
    st.text(max_size=5), st.tuples(st.text(max_size=5), st.integers(-64, 64))
)


@st.composite
def stored_events(draw):
    n = draw(st.integers(1, 4))
    return BlockStored(
        block_hashes=tuple(draw(st.lists(hashes, min_size=n, max_size=n))),
        parent_block_hash=draw(st.none() | hashes),
        token_ids=tuple(draw(st.lists(st.integers(0, 2**32 - 1), min_size=n * 4, max_size=n * 4))),
        block_size=4,
        lora_id=draw(st.none() | st.integers(1, 2**31)),
        medium=draw(st.sampled_from(["GPU", "CPU", "STORAGE"])),
        lora_name=draw(opt_text),
        extra_keys=tuple(draw(st.lists(extra_entry, min_size=n, max_size=n))),
        group_idx=draw(st.integers(0, 3)),
        kv_cache_spec_kind=draw(opt_text),
    )


events = st.one_of(
    stored_events(),
    st.builds(
        BlockRemoved,
        st.lists(hashes, min_size=1, max_size=3).map(tuple),
        st.sampled_from(["GPU", "CPU"]),
        st.integers(0, 3),
    ),
    st.just(AllBlocksCleared()),
)


@given(
    seq=st.integers(0, 2**63),
    nanos=st.integers(0, 2**62),
    evs=st.lists(events, max_size=5),
    rank=st.integers(0, 7),
)
def test_round_trip_is_lossless_for_what_openengine_carries(seq, nanos, evs, rank):
    codec = ProtobufEventCodec()
    batch = EventBatch(nanos / 1e9, tuple(evs), rank)
    got_seq, got = codec.decode(codec.encode(seq, batch))
    assert got_seq == seq and got.events == batch.events and got.data_parallel_rank == rank
    # protobuf bytes survive a serialization round trip too
    wire = codec.encode(seq, batch).SerializeToString()
    assert codec.decode(kv_pb2.KvEventBatch.FromString(wire))[1].events == batch.events


@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4))
def test_signed_hashes_round_trip_in_an_int64_stream(values):
    codec = ProtobufEventCodec("int64")
    batch = EventBatch(0.0, (BlockRemoved(tuple(values), "GPU", 0),), 0)
    assert codec.decode(codec.encode(0, batch))[1].events == batch.events
