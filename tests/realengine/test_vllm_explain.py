"""Acceptance of issue 36 on real vLLM: the router's promise, its explanations and its repair.

Two vLLM 0.32 servers with a small KV cache (160 blocks of 32 tokens: a little more than one
4096-token request, so a few prompts overflow it), each behind its ``tokenkeys serve`` sidecar,
and ``tokenkeys route`` in front, as a user runs them. Every claim is checked against what vLLM
itself did (its ``cached_tokens``, its ``/tokenize``):

- 200 requests over shared system prompts: the promise equals vLLM's ``cached_tokens`` on every
  request, and the accuracy metrics say so (promised = served per worker, no over- or
  under-promise);
- explain names the cause: a prefix held by the other worker, another ``cache_salt``, another
  LoRA adapter (vLLM keys an adapter's blocks with its name and path), a prefix evicted by
  overflowing vLLM's cache (with the batch that removed it), and a worker restarted with
  another chat template (``renders_differently``; on that vLLM, ``tokenkeys parity`` names the
  request shapes that differ, issue 34's acceptance, ``test_vllm_parity.py``);
- a test-only fault in the sidecar's relay (``TOKENKEYS_TEST_DROP_REMOVAL_BATCHES``) keeps the
  batches that evict two prompts from the router: routed again, each answer is short, the
  events prove the index stale, the worker is resynchronised from its sidecar's snapshot and
  promises match again.

The module's servers start twice (the two workers) and one of them once more with the other
chat template (the last test, where ``tokenkeys parity`` also runs against it); nothing else
uses this configuration.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from route_process import RouteProcess
from test_vllm_parity import assert_another_template_differs

from served_pair import TokenkeysServe, running, sidecar_args, wait_for
from vllm_server import (
    BLOCK_SIZE,
    LORA_NAME,
    MODEL_NAME,
    OTHER_CHAT_TEMPLATE,
    ServerConfig,
    VllmServer,
)

#: A small cache (vLLM needs 128 blocks for one 4096-token request), and the harness's LoRA
#: adapter (``--lora-modules ada=PATH``) for the "another adapter" cause.
EXPLAIN = ServerConfig(num_blocks=160, lora=True)

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(EXPLAIN, EXPLAIN.second())]

VOCAB = 49152
VERSION = ("--kv-events-vllm-version", "0.32")
TEST_DROP = "TOKENKEYS_TEST_DROP_REMOVAL_BATCHES"
EXPLAIN_HEADER = "x-tokenkeys-explain"


@pytest.fixture(scope="module")
def fault(tmp_path_factory) -> Iterator[Path]:
    """The file whose presence switches the sidecars' test-only relay fault on."""
    path = tmp_path_factory.mktemp("fault") / "drop-removals"
    os.environ[TEST_DROP] = str(path)
    try:
        yield path
    finally:
        os.environ.pop(TEST_DROP, None)


@pytest.fixture(scope="module")
def engines(vllm_pool) -> list[VllmServer]:
    return [vllm_pool.get(EXPLAIN), vllm_pool.get(EXPLAIN.second())]


@pytest.fixture(scope="module")
def sidecars(engines, fault) -> Iterator[list[TokenkeysServe]]:
    started = [TokenkeysServe(*sidecar_args(e, *VERSION)) for e in engines]
    with running(*started, timeout=600):
        yield started


@pytest.fixture(scope="module")
def router(sidecars, tmp_path_factory) -> Iterator[httpx.Client]:
    workers = [a for s in sidecars for a in ("--worker", s.target)]
    cache = str(tmp_path_factory.mktemp("route-cache"))
    with RouteProcess(*workers, "--poll-interval", "1", cache=cache) as process:
        with httpx.Client(base_url=process.url, timeout=300) as client:
            wait_for(lambda: len(ready(client)) == 2, "both workers ready at the router")
            yield client


def ready(client: httpx.Client) -> list[str]:
    workers = client.get("/router/workers").json()["workers"]
    return [w["address"] for w in workers if w["state"] == "ready"]


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def complete(client: httpx.Client, prompt: list[int], **extra: object) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, **extra}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def cached(response: httpx.Response) -> int:
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def promise(response: httpx.Response) -> tuple[int, int]:
    """(expected, served) cached tokens of a routed answer."""
    expected = int(response.headers["x-tokenkeys-expected-cached-tokens"])
    served = int(response.headers["x-tokenkeys-served-cached-tokens"])
    assert served == cached(response)
    return expected, served


def explain(client: httpx.Client, prompt: list[int], **extra: object) -> dict:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, **extra}
    response = client.post("/router/explain", json={"route": "/v1/completions", "body": body})
    assert response.status_code == 200, response.text
    return response.json()


def part(doc: dict, address: str) -> dict:
    return next(w for w in doc["workers"] if w["worker"] == address)


def settled(client: httpx.Client, prompt: list[int], worker: str, **extra: object) -> None:
    """Wait until the router's index holds every full block of ``prompt`` at ``worker``
    (the events of its answer applied, and every batch vLLM published before them)."""
    wait_for(
        lambda: (
            part(explain(client, prompt, **extra), worker)["held_blocks"]
            == len(prompt) // BLOCK_SIZE
        ),
        "the answer's blocks in the router's index",
    )


def metrics(client: httpx.Client) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def metric(values: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in values.items() if n == name and want <= set(ls))


def show(values: dict, title: str, *names: str) -> None:
    """Print the router's samples whose names contain one of ``names`` (docs/router.md's
    worked example is this output; run with ``-s``)."""
    print(f"\n--- {title}")
    for (name, labels), value in sorted(values.items()):
        if any(n in name for n in names) and not name.endswith("_created"):
            print(f"{name}{{{','.join(f'{k}={v!r}' for k, v in labels)}}} {value}")


def direct(sidecar: TokenkeysServe, prompt: list[int], **extra: object) -> int:
    """``cached_tokens`` of ``prompt`` sent straight to a sidecar (the router routes nothing)."""
    with httpx.Client(base_url=sidecar.url, timeout=300) as client:
        return cached(complete(client, prompt, **extra))


def by_target(sidecars: list[TokenkeysServe], address: str) -> TokenkeysServe:
    return next(s for s in sidecars if s.target == address)


def in_snapshot(sidecar: TokenkeysServe, block: list[int]) -> bool:
    """The sidecar's snapshot holds a block of exactly these tokens."""
    snap = httpx.get(f"{sidecar.url}/v1/kv/snapshot", params={"model": MODEL_NAME}, timeout=60)
    return any(b["token_ids"] == block for b in snap.json()["blocks"])


def overflow(sidecar: TokenkeysServe, rng: random.Random) -> None:
    """Fill the worker's 160 blocks with fresh prompts (30 blocks each), evicting the rest."""
    for _ in range(6):
        direct(sidecar, tokens(rng, 30 * BLOCK_SIZE))


def test_200_requests_are_promised_exactly_what_vllm_serves(router) -> None:
    rng = random.Random(36)
    prefixes = [tokens(rng, 6 * BLOCK_SIZE) for _ in range(8)]
    for _ in range(200):
        prompt = rng.choice(prefixes) + tokens(rng, BLOCK_SIZE // 2 + rng.randrange(2 * BLOCK_SIZE))
        response = complete(router, prompt)
        expected, served = promise(response)
        assert served == expected, (expected, served)
        settled(router, prompt, response.headers["x-tokenkeys-worker"])
    values = metrics(router)
    promised = metric(values, "tokenkeys_router_promised_cached_tokens_total")
    served_total = metric(values, "tokenkeys_router_served_cached_tokens_total")
    assert promised == served_total > 0
    for address in ready(router):
        mine = {"worker": address}
        assert metric(values, "tokenkeys_router_promised_cached_tokens_total", **mine) == metric(
            values, "tokenkeys_router_served_cached_tokens_total", **mine
        )
    assert metric(values, "tokenkeys_router_over_promises_total") == 0
    assert metric(values, "tokenkeys_router_under_promises_total") == 0
    assert metric(values, "tokenkeys_router_misses_total", cause="promised_not_served") == 0
    show(values, "200 requests", "promised_cached", "served_cached", "_promises_total", "misses")


def test_held_elsewhere_and_another_cache_salt(router, sidecars) -> None:
    rng = random.Random(361)
    prompt = tokens(rng, 6 * BLOCK_SIZE + 5)
    holder = complete(router, prompt).headers["x-tokenkeys-worker"]
    other = next(a for a in ready(router) if a != holder)
    settled(router, prompt, holder)
    doc = explain(router, prompt)
    assert part(doc, holder)["cause"] is None and part(doc, holder)["held_blocks"] == 6
    there = part(doc, other)
    assert (there["cause"], there["detail"]) == ("held_elsewhere", {"workers": [holder]})
    # What vLLM did: the holder serves the prefix from cache, the other serves none of it.
    assert direct(by_target(sidecars, holder), prompt) == 6 * BLOCK_SIZE
    assert direct(by_target(sidecars, other), prompt) == 0

    salted = tokens(rng, 5 * BLOCK_SIZE + 3)
    worker = complete(router, salted, cache_salt="tenant-a").headers["x-tokenkeys-worker"]
    settled(router, salted, worker, cache_salt="tenant-a")
    mine = part(explain(router, salted), worker)
    assert (mine["cause"], mine["first_missing_block"]) == ("other_context", 0)
    assert mine["detail"] == {"cache_salt": "another"}  # the salt itself is never shown
    # What vLLM did: without the salt it reuses nothing of the salted blocks.
    assert direct(by_target(sidecars, worker), salted) == 0


def test_another_adapter(router, sidecars) -> None:
    rng = random.Random(364)
    prompt = tokens(rng, 5 * BLOCK_SIZE + 7)
    worker = complete(router, prompt, model=LORA_NAME).headers["x-tokenkeys-worker"]
    settled(router, prompt, worker, model=LORA_NAME)
    mine = part(explain(router, prompt), worker)  # asked for the base model
    assert (mine["cause"], mine["first_missing_block"]) == ("other_context", 0), mine
    assert mine["detail"] == {"adapter": LORA_NAME}
    # What vLLM did: the base model reuses nothing of the adapter's blocks; the adapter all.
    sidecar = by_target(sidecars, worker)
    assert direct(sidecar, prompt) == 0
    assert direct(sidecar, prompt, model=LORA_NAME) == 5 * BLOCK_SIZE
    # The other way round: held for the base model, asked with the adapter.
    base = tokens(rng, 4 * BLOCK_SIZE + 3)
    holder = complete(router, base).headers["x-tokenkeys-worker"]
    settled(router, base, holder)
    theirs = part(explain(router, base, model=LORA_NAME), holder)
    assert (theirs["cause"], theirs["detail"]) == ("other_context", {"adapter": None}), theirs
    assert direct(by_target(sidecars, holder), base, model=LORA_NAME) == 0


def test_a_prefix_evicted_by_overflowing_vllm_names_its_batch(router, sidecars) -> None:
    rng = random.Random(362)
    prompt = tokens(rng, 6 * BLOCK_SIZE + 5)
    worker = complete(router, prompt).headers["x-tokenkeys-worker"]
    settled(router, prompt, worker)
    sidecar = by_target(sidecars, worker)
    before = metric(metrics(router), "tokenkeys_router_kv_events_total", type="BlockRemoved")
    overflow(sidecar, rng)
    last = tokens(rng, 4 * BLOCK_SIZE)
    direct(sidecar, last)
    settled(router, last, worker)
    assert metric(metrics(router), "tokenkeys_router_kv_events_total", type="BlockRemoved") > before
    doc = explain(router, prompt)
    print("\n--- explain after the overflow\n" + json.dumps(doc, indent=1))
    mine = part(doc, worker)
    assert mine["cause"] == "evicted", mine
    assert mine["held_blocks"] == mine["first_missing_block"] < 6
    assert mine["detail"]["seq"] is not None and mine["detail"]["engine_ts"] > 0
    # What vLLM did: it holds exactly the blocks the router says, no more.
    assert direct(sidecar, prompt) == mine["held_blocks"] * BLOCK_SIZE


def test_a_dropped_batch_is_detected_by_short_answers_and_repaired(router, sidecars, fault):
    rng = random.Random(363)
    first, second = tokens(rng, 5 * BLOCK_SIZE + 3), tokens(rng, 5 * BLOCK_SIZE + 9)
    worker = complete(router, first).headers["x-tokenkeys-worker"]
    settled(router, first, worker)
    sidecar = by_target(sidecars, worker)
    assert direct(sidecar, second) == 0
    settled(router, second, worker)
    # The test-only fault: the relay keeps every batch that evicts from the router.
    fault.touch()
    try:
        overflow(sidecar, rng)
        # vLLM's events of an answer may reach the relay after the answer: a probe's block in
        # the relay's ledger means every batch before it went through the fault.
        probe = tokens(rng, BLOCK_SIZE + 3)
        direct(sidecar, probe)
        wait_for(lambda: in_snapshot(sidecar, probe[:BLOCK_SIZE]), "the probe in the ledger")
    finally:
        fault.unlink()
    assert "test fault" in sidecar.log_text()
    for prompt in (first, second):  # the index still claims both prefixes
        assert part(explain(router, prompt), worker)["held_blocks"] == 5
    resyncs = "tokenkeys_router_worker_resyncs_total"
    assert metric(metrics(router), resyncs, reason="stale_answers") == 0
    # Routed to the stale worker, each is promised and served short; the answer's explanation
    # (asked in a header) names the first block it did not serve.
    for prompt in (first, second):
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}
        response = router.post("/v1/completions", json=body, headers={EXPLAIN_HEADER: "1"})
        assert response.status_code == 200, response.text
        assert response.headers["x-tokenkeys-worker"] == worker
        expected, served = promise(response)
        assert served < expected == 5 * BLOCK_SIZE
        said = json.loads(response.headers[EXPLAIN_HEADER])
        print(f"\n--- {EXPLAIN_HEADER}: {response.headers[EXPLAIN_HEADER]}")
        assert said["cause"] == "promised_not_served"
        assert said["first_missing_block"] == served // BLOCK_SIZE
    wait_for(
        lambda: metric(metrics(router), resyncs, reason="stale_answers", source="snapshot") == 1,
        "the stale worker's repair from its snapshot",
    )
    values = metrics(router)
    short = "tokenkeys_router_short_answers_total"
    assert metric(values, short, worker=worker, verdict="stale") == 2
    assert metric(values, short, verdict="explained") == 0
    show(values, "after the repair", "short_answers", "resyncs", "over_promises", "clears")
    # Repaired: the promises match vLLM again, on the repaired prompts and new ones.
    for prompt in (first, second, tokens(rng, 4 * BLOCK_SIZE + 1), first):
        settled_worker = complete(router, prompt)
        expected, served = promise(settled_worker)
        assert served == expected, (expected, served)
        settled(router, prompt, settled_worker.headers["x-tokenkeys-worker"])
    values = metrics(router)
    assert metric(values, resyncs, reason="stale_answers") == 1
    show(values, "the module's accuracy at the end", "promised_cached", "served_cached")


def test_a_worker_restarted_with_another_chat_template_renders_differently(
    router, engines, sidecars
) -> None:
    messages = [{"role": "user", "content": "Which trains leave Alder before noon?"}]
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 1}
    restarted, kept = engines[1], engines[0]
    old = sidecars[1]
    try:
        old.stop()
        restarted.config = replace(restarted.config, chat_template=OTHER_CHAT_TEMPLATE)
        restarted.restart()
        template_dir = str(Path(OTHER_CHAT_TEMPLATE).parent)
        args = sidecar_args(restarted, *VERSION, "--chat-template", OTHER_CHAT_TEMPLATE)
        args += ("--allowed-template-dir", template_dir)
        new = TokenkeysServe(*args, ports=(old.port, old.grpc_port))
        try:
            new.wait_healthy(timeout=600)
            wait_for(
                lambda: (
                    part(
                        router.post(
                            "/router/explain", json={"route": "/v1/chat/completions", "body": body}
                        ).json(),
                        new.target,
                    )["cause"]
                    == "renders_differently"
                ),
                "the restarted worker refused for its fingerprint",
            )
            doc = router.post(
                "/router/explain", json={"route": "/v1/chat/completions", "body": body}
            ).json()
            mine = part(doc, new.target)
            assert mine["state"] == "refused"
            fingerprints = mine["detail"]
            assert fingerprints["worker_fingerprint"] != fingerprints["router_fingerprint"]
            # What vLLM does: the two engines render this chat to different token ids.
            tokenize = {"model": MODEL_NAME, "messages": messages}
            ids = [
                httpx.post(f"{e.url}/tokenize", json=tokenize, timeout=60).json()["tokens"]
                for e in (kept, restarted)
            ]
            assert ids[0] != ids[1]
            # Issue 34: tokenkeys parity names what differs on this vLLM (no server of its own).
            assert_another_template_differs(restarted.url)
        finally:
            new.stop()
    finally:
        # Nothing else uses this server: stopped, the pool drops it at its next request.
        restarted.stop()
