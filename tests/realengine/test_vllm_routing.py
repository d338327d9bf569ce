"""Acceptance: ``tokenkeys route`` in front of sidecars of real vLLM servers (issue 12).

Two vLLM 0.32 servers (the pool's shared default one and one more of the same configuration),
each behind its ``tokenkeys serve --engine vllm+http://...`` sidecar, and ``tokenkeys route
--worker SIDECAR...`` in front, exactly as a user runs them. Requests sharing long prefixes
reach the engine holding them, and vLLM's own ``cached_tokens`` total beats round robin on the
same workload shape. One vLLM killed: every request still succeeds and the router marks it
down; restarted on its ports: taken back. A sidecar with a wrong ``--root-seed`` counts and logs
the mismatch, advertises its keys unverified, and the router routes it by load.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from route_process import RouteProcess
from test_vllm_sidecar import keys_checked, wait_for

from tokenkeys._gen.openengine.v1 import model_pb2, openengine_pb2_grpc

from served_pair import TokenkeysServe, sidecar_args
from vllm_server import BLOCK_SIZE, DEFAULT_CONFIG, MODEL_NAME, VllmServer

pytestmark = pytest.mark.realengine

VOCAB = 49152
PREFIX_BLOCKS = 8  # long shared prefixes: 256 tokens
GROUPS = 3  # odd, so round robin does not happen to send a group to the same engine each round
ROUNDS = 4
VERSION = ("--kv-events-vllm-version", "0.32")


@pytest.fixture(scope="module")
def engines(vllm_pool, vllm_python, tiny_model, tmp_path_factory) -> Iterator[list[VllmServer]]:
    first = vllm_pool.get(DEFAULT_CONFIG)
    second = VllmServer(vllm_python, tiny_model, DEFAULT_CONFIG, tmp_path_factory.mktemp("vllm-b"))
    try:
        second.wait_healthy()
        yield [first, second]
    finally:
        second.stop()


@pytest.fixture(scope="module")
def sidecars(engines) -> Iterator[list[TokenkeysServe]]:
    started = [TokenkeysServe(*sidecar_args(e, *VERSION)) for e in engines]
    try:
        for sidecar in started:
            sidecar.wait_healthy()
        yield started
    finally:
        for sidecar in started:
            sidecar.stop()


def route(*args: str, cache: Path) -> RouteProcess:
    return RouteProcess(*args, "--poll-interval", "1", cache=str(cache))


def workers_of(*sidecars: TokenkeysServe) -> list[str]:
    return [a for s in sidecars for a in ("--worker", s.target)]


def complete(client: httpx.Client, prompt: list[int]) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def cached(response: httpx.Response) -> int:
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def run_workload(client: httpx.Client, seed: int, wait_prefix: bool) -> tuple[int, list[list]]:
    """ROUNDS rounds of one request per prefix group; vLLM's cached tokens, workers per group."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(PREFIX_BLOCKS * BLOCK_SIZE)] for _ in range(3)]
    total, chosen = 0, [[] for _ in prefixes]
    for turn in range(ROUNDS):
        for g, prefix in enumerate(prefixes):
            prompt = prefix + [rng.randrange(VOCAB) for _ in range(BLOCK_SIZE // 2)]
            if turn and wait_prefix:  # the previous round's events reached the router
                wait_for(
                    lambda p=prompt: (
                        client.post("/router/route", json={"prompt": p}).json()["reason"]
                        == "prefix"
                    ),
                    "the prefix's events at the router",
                )
            response = complete(client, prompt)
            total += cached(response)
            chosen[g].append(response.headers["x-tokenkeys-worker"])
    return total, chosen


def test_prefixes_reach_their_engine_and_beat_round_robin(sidecars, tmp_path) -> None:
    with route(*workers_of(*sidecars), cache=tmp_path / "a") as router:
        with httpx.Client(base_url=router.url, timeout=300) as client:
            precise, chosen = run_workload(client, 1, wait_prefix=True)
    for workers in chosen:
        assert len(set(workers)) == 1  # every round of a group reached the engine holding it
    assert precise == GROUPS * (ROUNDS - 1) * PREFIX_BLOCKS * BLOCK_SIZE
    with route(*workers_of(*sidecars), "--policy", "round_robin", cache=tmp_path / "b") as rr:
        with httpx.Client(base_url=rr.url, timeout=300) as client:
            round_robin, _ = run_workload(client, 2, wait_prefix=False)
    assert precise > round_robin


def test_a_wrong_root_seed_is_caught_and_routed_by_load(engines, tmp_path) -> None:
    wrong = TokenkeysServe(*sidecar_args(engines[0], *VERSION, "--root-seed", "999"))
    try:
        wrong.wait_healthy()
        with route(*workers_of(wrong), cache=tmp_path / "c") as router:
            with httpx.Client(base_url=router.url, timeout=300) as client:
                prompt = [random.Random(41).randrange(VOCAB) for _ in range(3 * BLOCK_SIZE)]
                complete(client, prompt)
                wait_for(lambda: keys_checked(wrong.url)["mismatch"] >= 1, "a counted mismatch")
                assert keys_checked(wrong.url)["match"] == 0
                log = wrong.log_text()
                assert log.count("do not match the engine's") == 1  # logged once
                assert "root seed" in log
                with grpc.insecure_channel(wrong.target) as channel:
                    control = openengine_pb2_grpc.ControlStub(channel)
                    info = control.GetModelInfo(
                        model_pb2.GetModelInfoRequest(model=MODEL_NAME), timeout=30
                    )
                assert info.tokenizer.keys_unverified is True
                wait_for(
                    lambda: (
                        client.post("/router/route", json={"prompt": prompt}).json()["reason"]
                        == "keys_unverified"
                    ),
                    "the router routing the worker by load",
                )
                response = complete(client, prompt)
                assert response.headers["x-tokenkeys-reason"] == "keys_unverified"
                metrics = client.get("/metrics").text
                assert 'reason="keys_unverified"' in metrics
    finally:
        wrong.stop()


def worker_state(client: httpx.Client, target: str) -> str:
    workers = client.get("/router/workers").json()["workers"]
    return next(w["state"] for w in workers if w["address"] == target)


def test_a_killed_engine_is_routed_around_and_taken_back(engines, sidecars, tmp_path) -> None:
    rng = random.Random(51)
    with route(*workers_of(*sidecars), cache=tmp_path / "d") as router:
        with httpx.Client(base_url=router.url, timeout=300) as client:
            engines[1].stop()
            # Every request answers (none hangs, none fails) while the router finds out.
            for _ in range(6):
                complete(client, [rng.randrange(VOCAB) for _ in range(2 * BLOCK_SIZE)])
            wait_for(lambda: worker_state(client, sidecars[1].target) == "down", "B down")
            for _ in range(4):
                response = complete(client, [rng.randrange(VOCAB) for _ in range(BLOCK_SIZE)])
                assert response.headers["x-tokenkeys-worker"] == sidecars[0].target
            engines[1].restart()
            wait_for(lambda: worker_state(client, sidecars[1].target) == "ready", "B back")

            def reaches_b() -> bool:
                prompt = [rng.randrange(VOCAB) for _ in range(2 * BLOCK_SIZE)]
                return complete(client, prompt).headers["x-tokenkeys-worker"] == sidecars[1].target

            wait_for(reaches_b, "a request served by the restarted engine")
