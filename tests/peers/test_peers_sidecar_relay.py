"""Consumers of the vLLM sidecar's relay: Dynamo's standalone indexer agrees with tokenkeys'
router, and smg's relay checks every hash, also across a vLLM restart behind the sidecar.

A real vLLM 0.32 (the harness' shared default server) behind ``tokenkeys serve --engine
vllm+http://...``: the sidecar checks vLLM's events and relays them on its own ZMQ endpoint
(with replay). A real ``dynamo.indexer`` (ai-dynamo-runtime 1.6.1) registers that endpoint, and
``tokenkeys route`` follows the sidecar. For a shared-prefix workload (system prompts of several
blocks, each followed by questions) every prompt's matched blocks are equal in Dynamo, in the
router (``POST /router/route``) and in vLLM itself (its ``cached_tokens`` when the prompt is
sent again). Then vLLM restarts on its ports with an empty cache: vLLM's own sequence starts at
0 again, but the sidecar's stream never goes back and announces the restart with
``AllBlocksCleared`` before the new run's blocks, so Dynamo holds none of the old blocks and
indexes the new ones (issue 22: a sequence that goes back made Dynamo drop batches).

All along, smg-grpc-servicer 0.14.1's released relay (``smg_kv_relay.py``, its
``vllm-sha256-cbor`` check on) streams the same endpoint: it checks every block vLLM stored
against vLLM's own hash and finds no mismatch, and since the sidecar's sequence never goes back
the vLLM restart reaches it as a forwarded ``AllBlocksCleared``, not as ``DATA_LOSS``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import PeerDriver
from dynamo_agreement import wait_for
from dynamo_indexer import DynamoIndexer
from ports import free_port
from route_process import RouteProcess
from smg_kv_relay import Subscription

from served_pair import TokenkeysServe, sidecar_args
from vllm_server import BLOCK_SIZE, DEFAULT_CONFIG, MODEL_NAME, VllmServer

pytestmark = [
    pytest.mark.peers,
    pytest.mark.realengine,
    pytest.mark.vllm_servers(DEFAULT_CONFIG),
]

VOCAB = 49152
SYSTEM_BLOCKS = 4


class Relay:
    """The sidecar in front of vLLM, its relay's endpoints, the router and Dynamo on them."""

    def __init__(self, vllm: VllmServer, dynamo_python: Path, smg: PeerDriver, cache: Path) -> None:
        self.vllm = vllm
        events, replay = free_port(), free_port()
        self.sidecar = TokenkeysServe(
            *sidecar_args(vllm, "--kv-events-vllm-version", "0.32"),
            "--kv-events-port", str(events), "--kv-events-replay-port", str(replay),
        )  # fmt: skip
        self.sidecar.wait_healthy(timeout=600)
        self.route = RouteProcess("--worker", self.sidecar.target, cache=str(cache))
        self.route.__enter__()
        self.dynamo = DynamoIndexer(dynamo_python, BLOCK_SIZE, MODEL_NAME)
        self.dynamo.wait_ready()
        self.dynamo.register(1, f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}")
        self.client = httpx.Client(timeout=300)
        self.smg = Subscription(smg, f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}")

    def smg_relaying(self, rng: random.Random) -> None:
        """Until smg's relay is subscribed (it misses what was published before it joined):
        fresh probe prompts until one is forwarded."""
        for _ in range(20):
            self.complete([rng.randrange(VOCAB) for _ in range(BLOCK_SIZE)])
            try:
                wait_for(lambda: self.smg.stored_blocks(), "a forwarded probe", timeout=3.0)
                return
            except AssertionError:
                continue
        raise AssertionError("smg's relay never forwarded a probe")

    def complete(self, ids: list[int]) -> int:
        """Send a prompt through the sidecar; vLLM's ``cached_tokens`` for it."""
        answer = self.client.post(
            f"{self.sidecar.url}/v1/completions",
            json={"model": MODEL_NAME, "prompt": ids, "max_tokens": 1},
        )
        assert answer.status_code == 200, answer.text
        details = answer.json()["usage"].get("prompt_tokens_details") or {}
        return details.get("cached_tokens") or 0

    def routed(self, ids: list[int]) -> int | str:
        """The blocks of ``ids`` tokenkeys' router says the sidecar's vLLM holds (or why it
        cannot say: while vLLM restarts the router has no ready worker for a while)."""
        answer = self.client.post(
            f"{self.route.url}/router/route", json={"model": MODEL_NAME, "prompt": ids}
        )
        if answer.status_code != 200:
            return f"{answer.status_code}: {answer.text}"
        (row,) = answer.json()["ranking"]
        return row["matched_blocks"]

    def indexed(self, ids: list[int]) -> int:
        """The blocks of ``ids`` Dynamo's indexer says worker 1 holds."""
        return self.dynamo.matched_tokens(ids).get(1, 0) // BLOCK_SIZE

    def agree(self, ids: list[int], blocks: int) -> None:
        """Router and Dynamo both reach ``blocks`` for ``ids`` (events are asynchronous)."""
        seen: list[tuple[int, int]] = []

        def both() -> bool:
            seen.append((self.routed(ids), self.indexed(ids)))
            return seen[-1] == (blocks, blocks)

        try:
            wait_for(both, f"router and Dynamo at {blocks} blocks")
        except AssertionError as exc:
            message = f"{exc}: (router, Dynamo) = {seen[-1:]}; {self.dynamo.log()}"
            raise AssertionError(message) from None

    def close(self) -> None:
        if self.smg.call.is_active():
            self.smg.close()
        self.client.close()
        self.dynamo.close()
        self.route.__exit__(None, None, None)
        self.sidecar.stop()


@pytest.fixture
def relay(vllm_pool, dynamo_python: Path, smg_kv_relay_peer, tmp_path: Path) -> Iterator[Relay]:
    vllm = vllm_pool.get(DEFAULT_CONFIG)
    relay = Relay(vllm, dynamo_python, smg_kv_relay_peer, tmp_path / "route-cache")
    try:
        yield relay
    finally:
        relay.close()


def _workload(rng: random.Random, systems: int, questions: int) -> list[list[int]]:
    """Prompts of ``systems`` shared system prompts, each followed by its own questions."""
    out = []
    for _ in range(systems):
        system = [rng.randrange(VOCAB) for _ in range(SYSTEM_BLOCKS * BLOCK_SIZE)]
        for _ in range(questions):
            out.append(system + [rng.randrange(VOCAB) for _ in range(BLOCK_SIZE + 5)])
    return out


def test_the_sidecars_relay_consumers_agree_and_forget_a_restarted_vllm(relay) -> None:
    rng = random.Random(22)
    relay.smg_relaying(rng)
    before = _workload(rng, systems=3, questions=2)
    for ids in before:
        relay.complete(ids)
    for ids in before:  # each whole block of each prompt is cached (the tail is partial)
        relay.agree(ids, len(ids) // BLOCK_SIZE)
        assert relay.complete(ids) == len(ids) // BLOCK_SIZE * BLOCK_SIZE  # vLLM agrees
    unseen = [rng.randrange(VOCAB) for _ in range(3 * BLOCK_SIZE)]
    relay.agree(before[0][: SYSTEM_BLOCKS * BLOCK_SIZE] + unseen, SYSTEM_BLOCKS)

    relay.vllm.restart()  # same ports, empty prefix cache, its sequence from 0 again
    after = _workload(rng, systems=1, questions=2)
    for ids in after:
        relay.complete(ids)
    for ids in after:  # the new run's blocks are indexed
        relay.agree(ids, len(ids) // BLOCK_SIZE)
    for ids in before:  # and none of the old run's is left
        relay.agree(ids, 0)
    # What did it: the sidecar saw vLLM's sequence go back and announced the restart.
    assert "vLLM's KV-event publisher restarted" in relay.sidecar.log_text()
    assert relay.smg.ended is None, relay.smg.details  # no DATA_LOSS: one stream throughout
    assert relay.smg.cleared() >= 1  # the restart reached smg as a clear
    (counts,) = relay.smg.close()
    assert counts["hash_mismatch"] == 0, counts
    assert counts["hash_unverifiable"] == 0, counts
    assert counts["hash_checked"] == len(relay.smg.stored_blocks()) > 0, counts
