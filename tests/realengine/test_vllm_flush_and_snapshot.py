"""The vLLM sidecar's KV-event snapshot and smg's FlushCache against a real vLLM 0.32.

One sidecar (``tokenkeys serve --engine vllm+http://... --vllm-engine-face``) in front of the
harness's shared default vLLM, whose dev routes are on (``VLLM_SERVER_DEV_MODE=1``, see
``vllm_server.ServerConfig.dev_mode``). vLLM is the judge throughout:

- ``SubscribeKvEvents`` with ``include_snapshot`` opens with the relay's snapshot; the prompt
  vLLM reports as cached (``cached_tokens``) is in it block for block, and the batches that
  follow are numbered on from it without a gap.
- smg's ``FlushCache`` through the face reaches vLLM's ``/reset_prefix_cache``: vLLM answers the
  prompts again with 0 cached tokens, and the open stream carries vLLM's ``AllBlocksCleared``
  relayed by the sidecar (vLLM publishes it with its next scheduler step, before that step's
  stores).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest

from tokenkeys._gen.openengine.v1 import kv_pb2, openengine_pb2_grpc
from tokenkeys.keys import block_keys, make_spec

from served_pair import TokenkeysServe, sidecar_args
from smg_stubs import require_smg_stubs
from vllm_server import BLOCK_SIZE, DEFAULT_CONFIG, MODEL_NAME, VllmServer

require_smg_stubs()
from tokenkeys.server.grpc.vllm_engine.stubs import common_pb2, vllm_engine_pb2_grpc  # noqa: E402

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(DEFAULT_CONFIG)]

VOCAB = 49152
SPEC = make_spec("vllm/sha256_cbor@0.31", BLOCK_SIZE)  # vLLM's default root (no PYTHONHASHSEED)
WAIT_LIMIT = 120.0  # seconds: a safety net for a broken engine, never a pass/fail criterion


@pytest.fixture(scope="module")
def sidecar(vllm_pool) -> Iterator[TokenkeysServe]:
    vllm: VllmServer = vllm_pool.get(DEFAULT_CONFIG)
    process = TokenkeysServe(*sidecar_args(vllm, "--vllm-engine-face"))
    try:
        process.wait_healthy()
        yield process
    finally:
        process.stop()


def fresh_prompt(seed: int, blocks: int) -> list[int]:
    rng = random.Random(seed * 7_919 + int(time.time()))  # never cached before in this vLLM
    return [rng.randrange(100, VOCAB) for _ in range(blocks * BLOCK_SIZE + 5)]


def cached_tokens(sidecar: TokenkeysServe, prompt: list[int]) -> int:
    """vLLM's own count of the prompt's cached tokens, on one more request of it."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}
    answer = httpx.post(f"{sidecar.url}/v1/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def stored_hashes(batch: kv_pb2.KvEventBatch) -> list[int]:
    return [
        int.from_bytes(h.value, "big")
        for e in batch.events
        if e.WhichOneof("event") == "block_stored"
        for h in e.block_stored.block_hashes
    ]


def stored_hashes_of(event: kv_pb2.KvEvent) -> list[int]:
    if event.WhichOneof("event") != "block_stored":
        return []
    return [int.from_bytes(h.value, "big") for h in event.block_stored.block_hashes]


def read_until(stream, predicate) -> list[kv_pb2.KvEventBatch]:  # noqa: ANN001
    """Batches of ``stream`` up to the first one ``predicate`` accepts."""
    seen = []
    for message in stream:
        assert message.WhichOneof("event") == "batch", message
        seen.append(message.batch)
        if predicate(message.batch):
            return seen
    raise AssertionError("the stream ended")


def test_include_snapshot_holds_what_vllm_caches_then_follows_and_flush_cache_clears(
    sidecar,
) -> None:
    first = fresh_prompt(1, 4)
    assert cached_tokens(sidecar, first) == 0  # stored by vLLM now
    want = [k.event_key for k in block_keys(first, SPEC)]
    channel = grpc.insecure_channel(sidecar.target)
    control = openengine_pb2_grpc.ControlStub(channel)
    try:
        # The relay may still be on its way with the prompt's batch: follow a plain stream
        # until it has passed, so the snapshot below is taken after it.
        live = control.SubscribeKvEvents(
            kv_pb2.SubscribeKvEventsRequest(start_sequence_number=0), timeout=WAIT_LIMIT
        )
        read_until(live, lambda b: want[0] in stored_hashes(b))
        live.cancel()
        stream = control.SubscribeKvEvents(
            kv_pb2.SubscribeKvEventsRequest(include_snapshot=True), timeout=WAIT_LIMIT
        )
        opening = next(stream).batch
        assert opening.events[0].WhichOneof("event") == "all_blocks_cleared"
        assert opening.key_spec.spec_fingerprint == SPEC.fingerprint
        snapshot = set(stored_hashes(opening))
        # vLLM, the judge: every block it reuses of the prompt is in the snapshot.
        reused = cached_tokens(sidecar, first) // BLOCK_SIZE
        assert reused == len(want) and set(want) <= snapshot
        # What follows is numbered on from the snapshot, without a gap.
        second = fresh_prompt(2, 3)
        second_keys = [k.event_key for k in block_keys(second, SPEC)]
        assert cached_tokens(sidecar, second) == 0
        after = read_until(stream, lambda b: second_keys[0] in stored_hashes(b))
        numbers = [b.sequence_number for b in after]
        assert numbers == list(range(opening.sequence_number + 1, numbers[-1] + 1))

        # smg's FlushCache through the face: vLLM's /reset_prefix_cache.
        face = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        answer = face.FlushCache(common_pb2.FlushCacheRequest(timeout_s=30), timeout=WAIT_LIMIT)
        assert answer.success, answer.message
        # vLLM queues its AllBlocksCleared at the reset and publishes it with its next step
        # (scheduler.update_from_output), ahead of that step's stores: a request makes it go.
        assert cached_tokens(sidecar, first) == 0 and cached_tokens(sidecar, second) == 0
        cleared = read_until(
            stream,
            lambda b: any(e.WhichOneof("event") == "all_blocks_cleared" for e in b.events),
        )
        stream.cancel()
        numbers = [b.sequence_number for b in cleared]
        assert numbers == list(range(after[-1].sequence_number + 1, numbers[-1] + 1))
        # Nothing of the old cache is stored again before the clear.
        events = [e for b in cleared for e in b.events]
        kinds = [e.WhichOneof("event") for e in events]
        before_clear = events[: kinds.index("all_blocks_cleared")]
        assert not {h for e in before_clear for h in stored_hashes_of(e)} & set(want)
    finally:
        channel.close()
