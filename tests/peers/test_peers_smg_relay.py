"""The face's KV events equal what smg-grpc-servicer 0.14.1's relay makes of the same batches.

vLLM 0.32's ``--grpc`` server relays its engine's events through ``smg_grpc_servicer.kv_relay``
(``decode_batch`` then ``Normalizer.normalize_batch``). Here random batches (stores with and
without parents, integer and digest hashes, LoRA names, salts and multimodal extra keys, every
medium, locality, ownership and cache-group case the relay gates on, repeated stores, removals,
clears) go through both: the released relay reads the vLLM msgpack payload tokenkeys publishes
for each batch, the face's converter reads the batch itself, and the protos must be equal.
"""

from __future__ import annotations

import random

import pytest

from tokenkeys.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from tokenkeys.events.vllm_codec import VllmMsgpackCodec

from smg_stubs import require_smg_stubs

require_smg_stubs()

from tokenkeys.server.grpc.vllm_engine.events import SmgEventConverter  # noqa: E402
from tokenkeys.server.grpc.vllm_engine.stubs import common_pb2  # noqa: E402

pytestmark = pytest.mark.peers

BLOCK = 16
MEDIA = (None, None, "GPU", "CPU", "CPU_PINNED", "DISK", "REMOTE", "floppy")
KINDS = (None, "full_attention", "sliding_window", "mamba")


def _hash(rng: random.Random) -> int | bytes:
    return rng.randrange(2**64) if rng.random() < 0.7 else rng.randbytes(32)


def _extra(rng: random.Random, blocks: int, lora: str | None) -> tuple | None:
    if rng.random() < 0.4:
        return None
    keys = []
    for index in range(blocks):
        entry: list = []
        if lora is not None:
            entry.append(lora)
        if rng.random() < 0.3:
            entry.append((rng.randbytes(8).hex(), rng.randrange(BLOCK)))
        if index == 0 and rng.random() < 0.5:
            entry.append(f"salt-{rng.randrange(3)}")
        if rng.random() < 0.1:
            entry.append(rng.randbytes(32))
        keys.append(tuple(entry) if entry else None)
    return tuple(keys)


def _stored(rng: random.Random, known: list) -> BlockStored:
    blocks = rng.randrange(1, 4)
    hashes = [_hash(rng) for _ in range(blocks)]
    if rng.random() < 0.05:
        hashes[-1] = hashes[0]  # a chain that repeats itself: the relay drops it
    width = BLOCK if rng.random() < 0.95 else BLOCK - 1
    lora = rng.choice((None, None, "ada"))
    group = rng.choice((None, None, 0, 1))
    event = BlockStored(
        block_hashes=tuple(hashes),
        parent_block_hash=rng.choice(known) if known and rng.random() < 0.6 else None,
        token_ids=tuple(rng.randrange(50_000) for _ in range(blocks * BLOCK)),
        block_size=width,
        lora_id=rng.choice((None, None, 3)),
        medium=rng.choice(MEDIA),
        lora_name=lora,
        extra_keys=_extra(rng, blocks, lora),
        group_idx=group,
        kv_cache_spec_kind=rng.choice(KINDS) if group is not None else None,
        locality=rng.choice((None, None, "LOCAL", "REMOTE")),
        ownership=rng.choice((None, None, None, "kvcr", "engine")),
        session_id=rng.choice((None, "session-1")),
    )
    known.extend(hashes)
    return event


def _batch(rng: random.Random, known: list, index: int) -> EventBatch:
    events = []
    for _ in range(rng.randrange(1, 5)):
        roll = rng.random()
        if roll < 0.6 or not known:
            events.append(_stored(rng, known))
        elif roll < 0.9:
            events.append(
                BlockRemoved(
                    block_hashes=tuple(rng.sample(known, min(len(known), rng.randrange(1, 3)))),
                    medium=rng.choice(MEDIA),
                    group_idx=rng.choice((None, 0, 1)),
                )
            )
        elif roll < 0.95 and events and isinstance(events[-1], BlockStored):
            events.append(events[-1])  # a second physical copy of the same blocks
        else:
            events.append(AllBlocksCleared())
    return EventBatch(ts=1_700_000_000.0 + index, events=tuple(events), data_parallel_rank=0)


@pytest.mark.parametrize("seed", range(8))
def test_the_faces_events_equal_the_released_relays(smg_relay_peer, seed):
    rng = random.Random(seed)
    known: list = []
    batches = [(seq, _batch(rng, known, seq)) for seq in range(40)]
    codec = VllmMsgpackCodec()
    theirs = smg_relay_peer.call(
        "normalize", batches=[[seq, codec.encode(batch).hex()] for seq, batch in batches]
    )
    converter = SmgEventConverter()
    for (seq, batch), expected in zip(batches, theirs, strict=True):
        ours = converter.convert(seq, batch)
        assert ours == common_pb2.KvEventBatch.FromString(bytes.fromhex(expected)), (seq, batch)
