"""The protobuf KV-event decoder under hostile input: random messages, random and truncated
bytes, unknown event kinds and malformed events are dropped and counted, never raised as
anything but InvalidArgument, and never cost the rest of the batch. (The vLLM msgpack decoder's
own fuzzing and version-skew tests live in test_events_vllm_codec.)"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys._gen.openengine.v1 import kv_pb2
from tokenkeys.errors import InvalidArgument
from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, EventBatch
from tokenkeys.events.protobuf_codec import ProtobufEventCodec

_HASH = st.builds(
    kv_pb2.KvBlockHash,
    value=st.binary(max_size=12),
    encoding=st.sampled_from(["uint64", "int64", "bytes", "", "u128", "UINT64"]),
)
_STORED = st.builds(
    kv_pb2.BlockStored,
    block_hashes=st.lists(_HASH, max_size=3),
    token_ids=st.lists(st.integers(0, 2**32 - 1), max_size=4),
    block_size=st.integers(0, 2**32 - 1),
    extra_keys=st.lists(
        st.builds(kv_pb2.OpaqueKeyTuple, values=st.lists(st.text(max_size=6), max_size=2)),
        max_size=2,
    ),
)
_EVENT = st.one_of(
    st.builds(kv_pb2.KvEvent, block_stored=_STORED),
    st.builds(
        kv_pb2.KvEvent, block_removed=st.builds(kv_pb2.BlockRemoved, block_hashes=st.lists(_HASH))
    ),
    st.builds(kv_pb2.KvEvent, all_blocks_cleared=st.builds(kv_pb2.AllBlocksCleared)),
    st.just(kv_pb2.KvEvent()),  # no kind set: what an unknown oneof member decodes to
)
_BATCH = st.builds(
    kv_pb2.KvEventBatch,
    sequence_number=st.integers(0, 2**64 - 1),
    timestamp_unix_nanos=st.integers(0, 2**63 - 1),
    events=st.lists(_EVENT, max_size=6),
)


@settings(max_examples=200, deadline=None)
@given(_BATCH)
def test_random_batches_decode_with_every_event_kept_or_counted(message) -> None:
    codec = ProtobufEventCodec()
    seq, batch = codec.decode(message)
    assert seq == message.sequence_number and isinstance(batch, EventBatch)
    assert len(batch.events) + codec.stats.dropped_events == len(message.events)


@settings(max_examples=200, deadline=None)
@given(_BATCH, st.data())
def test_truncated_and_random_bytes_never_crash(message, data) -> None:
    payload = message.SerializeToString()
    payload = payload[: data.draw(st.integers(0, len(payload)))]
    payload += data.draw(st.binary(max_size=16))
    codec = ProtobufEventCodec()
    try:
        parsed = kv_pb2.KvEventBatch.FromString(payload)
    except DecodeError:
        return  # the transport's parser refuses it before the codec sees it
    try:
        codec.decode(parsed)
    except InvalidArgument:  # pragma: no cover - decode drops bad events instead
        raise AssertionError("decode raised for a parseable batch") from None


def test_unknown_kinds_and_malformed_events_are_dropped_and_counted() -> None:
    good = kv_pb2.KvEvent(all_blocks_cleared=kv_pb2.AllBlocksCleared())
    bad_hash = kv_pb2.KvEvent(
        block_removed=kv_pb2.BlockRemoved(
            block_hashes=[kv_pb2.KvBlockHash(value=b"\x01\x02", encoding="uint64")]
        )
    )
    bad_extra = kv_pb2.KvEvent(
        block_stored=kv_pb2.BlockStored(extra_keys=[kv_pb2.OpaqueKeyTuple(values=["{not json"])])
    )
    removed = kv_pb2.KvEvent(
        block_removed=kv_pb2.BlockRemoved(
            block_hashes=[kv_pb2.KvBlockHash(value=b"\x00" * 7 + b"\x05", encoding="uint64")]
        )
    )
    # A newer sender's event kind: field 99 of KvEvent, unknown to this build.
    unknown = kv_pb2.KvEvent.FromString(b"\x9a\x06\x00")
    message = kv_pb2.KvEventBatch(
        sequence_number=7, events=[good, bad_hash, unknown, bad_extra, removed]
    )
    codec = ProtobufEventCodec()
    _, batch = codec.decode(message)
    assert batch.events == (AllBlocksCleared(), BlockRemoved((5,), medium=None, group_idx=0))
    assert codec.stats.malformed_events == 2
    assert codec.stats.unknown_types == {"<unknown or unset>": 1}
    assert codec.stats.dropped_events == 3
    assert "JSON" in codec.stats.last_problem
