"""Image prompts forwarded to an OpenEngine engine: ``Generate`` carries the media items.

A ``tokenkeys serve`` frontend (HTTP, the SmolVLM-layout folder, the image options) forwards
generation to a second ``tokenkeys serve`` process acting as the engine (real gRPC on loopback).
The frontend expands the images with the model's processor and sends token ids with one
``MediaItem`` per image (``uuid`` the identifier, ``placeholder`` its run); the engine keys the
image blocks with them. Both ends' keys are compared: the frontend's ``ComputeCacheKeys`` over
the Preprocessor's ids and features against the hashes the engine stores. A peer that does
not say it keys image items is refused before anything is sent.
"""

from __future__ import annotations

import base64
import io

import grpc
import httpx
import pytest
from engine_stack import ServeProcess
from served import Served
from smolvlm_folder import build_smolvlm_folder

from tokenkeys._gen.openengine.v1 import cache_keys_pb2 as kpb
from tokenkeys._gen.openengine.v1 import generation_pb2 as gen
from tokenkeys._gen.openengine.v1 import (
    kv_pb2,
    model_pb2,
    openengine_pb2_grpc,
    tokenizer_pb2_grpc,
)
from tokenkeys.engine.remote import RemoteEngine
from tokenkeys.errors import FailedPrecondition
from tokenkeys.events.model import BlockStored
from tokenkeys.events.protobuf_codec import ProtobufEventCodec
from tokenkeys.keys import KeyContext, MMItem
from tokenkeys.keys.proto import request_to_message
from tokenkeys.preprocess.images import ImageOptions
from tokenkeys.preprocess.preprocessor import Preprocessor
from tokenkeys.tokenizer import Tokenizer

PIL = pytest.importorskip("PIL.Image")
MODEL_ID = "/engines/tiny-smolvlm"


def _data_url(size: tuple[int, int], color: int) -> str:
    buffer = io.BytesIO()
    PIL.new("RGB", size, (color, 90, 180)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _chat(color: int) -> dict:
    parts = [
        {"type": "text", "text": "Two pictures, one question:"},
        {"type": "image_url", "image_url": {"url": _data_url((64, 64), color)}},
        {"type": "image_url", "image_url": {"url": _data_url((300, 100), color + 1)}},
    ]
    return {"messages": [{"role": "user", "content": parts}], "add_generation_prompt": True}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(engine, frontend, Preprocessor): the engine serves the folder with the simulated engine
    (no image options: it never sees an image, only items); the frontend takes images."""
    folder = build_smolvlm_folder(tmp_path_factory.mktemp("smolvlm"))
    pre = Preprocessor(Tokenizer.load(folder), images=ImageOptions(model_id=MODEL_ID))
    with ServeProcess("--model", str(folder)) as engine:
        args = ("--model", str(folder), "--mm-model-id", MODEL_ID, "--engine", engine.target)
        with Served(*args) as frontend:
            yield engine, frontend, pre


def _stored_hashes(target: str) -> set[int]:
    """Every block hash the engine holds now (its snapshot: AllBlocksCleared, BlockStored...)."""
    codec = ProtobufEventCodec()
    hashes: set[int] = set()
    with grpc.insecure_channel(target) as channel:
        control = openengine_pb2_grpc.ControlStub(channel)
        call = control.SubscribeKvEvents(kv_pb2.SubscribeKvEventsRequest(include_snapshot=True))
        try:
            # The snapshot is the stream's first batch.
            batch = codec.decode(next(call).batch)[1]
            for event in batch.events:
                if isinstance(event, BlockStored):
                    hashes.update(event.block_hashes)
        finally:
            call.cancel()
    return hashes


def _frontend_keys(frontend: Served, ids: list[int], context: KeyContext) -> list[int]:
    """The frontend's own ``ComputeCacheKeys`` answer (event form) for ``ids`` and ``context``."""
    with grpc.insecure_channel(frontend.grpc_target) as channel:
        stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
        request = request_to_message(ids, context)
        response = stub.ComputeCacheKeys(kpb.ComputeCacheKeysRequest(requests=[request]))
    return list(response.results[0].event_keys)


def test_the_engine_keys_image_blocks_as_the_frontend_computes_them(pair) -> None:
    engine, frontend, pre = pair
    url = f"http://{frontend.http_address}"
    chat = _chat(10)
    ours = pre.tokenize_chat(chat)
    ids = ours.tokens.ids
    answer = httpx.post(f"{url}/v1/chat/completions", json={**chat, "max_tokens": 1}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == len(ids)
    items = KeyContext(mm_items=tuple(f.item() for f in ours.features))
    keys = _frontend_keys(frontend, ids, items)
    text_only = _frontend_keys(frontend, ids, KeyContext())
    image_blocks = [i for i, (a, b) in enumerate(zip(keys, text_only, strict=True)) if a != b]
    assert len(image_blocks) >= 5  # the items reach most blocks (their keys chain on)
    stored = _stored_hashes(engine.target)
    assert set(keys) <= stored  # every block, image-bearing ones included, as computed
    assert not {text_only[i] for i in image_blocks} & stored  # never keyed as text


def test_another_image_of_the_same_size_is_not_a_cache_hit(pair) -> None:
    """Same ids, other images: only the blocks before the first image are served cached."""
    _, frontend, pre = pair
    url = f"http://{frontend.http_address}"
    chat, other = _chat(20), _chat(40)
    assert pre.tokenize_chat(chat).tokens.ids == pre.tokenize_chat(other).tokens.ids

    def cached(body: dict) -> int:
        answer = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 1})
        assert answer.status_code == 200, answer.text
        return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    start = pre.tokenize_chat(other).features[0].offset
    cached(chat)
    assert cached(other) <= start
    assert cached(chat) > start + 16


def _media(offset: int, length: int, **fields) -> gen.MediaItem:
    fields.setdefault("modality", gen.MODALITY_IMAGE)
    fields.setdefault("uuid", "item-1")
    return gen.MediaItem(placeholder=gen.MediaPlaceholder(offset=offset, length=length), **fields)


_UNPLACED = gen.MediaItem(modality=gen.MODALITY_IMAGE, uuid="x")  # no placeholder run


@pytest.mark.parametrize(
    ("media", "prompt", "code", "field"),
    [
        ([_media(1, 3, modality=gen.MODALITY_VIDEO)], False, "UNIMPLEMENTED", "media[0].modality"),
        ([_UNPLACED], False, "UNIMPLEMENTED", "media[0].placeholder"),
        ([_media(1, 3, uuid="")], False, "INVALID_ARGUMENT", "media[0].uuid"),
        ([_media(8, 3)], False, "INVALID_ARGUMENT", "media[0].placeholder"),
        ([_media(1, 0)], False, "INVALID_ARGUMENT", "media[0].placeholder"),
        ([_media(1, 3), _media(2, 3)], False, "INVALID_ARGUMENT", "media[1].placeholder"),
        ([_media(1, 3)], True, "UNIMPLEMENTED", "media"),
    ],
)  # fmt: skip
def test_the_engine_refuses_media_it_cannot_key(pair, media, prompt, code, field) -> None:
    engine = pair[0]
    request = gen.GenerateRequest(media=media)
    if prompt:
        request.prompt = "a text prompt"
    else:
        request.token_ids.ids.extend(range(10, 20))
    with grpc.insecure_channel(engine.target) as channel:
        with pytest.raises(grpc.RpcError) as info:
            list(openengine_pb2_grpc.InferenceStub(channel).Generate(request))
    assert info.value.code().name == code, info.value.details()
    assert field in info.value.details(), info.value.details()


class _TextOnlyEngine(openengine_pb2_grpc.ControlServicer, openengine_pb2_grpc.InferenceServicer):
    """A peer that does not key image items (``supports_multimodal`` false, as a tokenkeys
    engine before media items, or an engine that takes media only with their sources)."""

    def __init__(self) -> None:
        self.generated = 0

    async def GetModelInfo(self, request, context):  # noqa: ANN001, ANN201, N802
        return model_pb2.ModelInfo(served_model_name=request.model, supports_multimodal=False)

    async def Generate(self, request, context):  # noqa: ANN001, ANN201, N802
        self.generated += 1
        yield gen.GenerateResponse(request_id=request.request_id)


async def test_a_peer_that_does_not_take_media_gets_a_refusal_naming_it() -> None:
    peer = _TextOnlyEngine()
    server = grpc.aio.server()
    openengine_pb2_grpc.add_ControlServicer_to_server(peer, server)
    openengine_pb2_grpc.add_InferenceServicer_to_server(peer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    target = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(target)
    try:
        remote = RemoteEngine(target, "vlm", channel)
        context = KeyContext(mm_items=(MMItem("a" * 64, 2, 5),))
        with pytest.raises(FailedPrecondition) as info:
            async for _ in remote.generate(list(range(10)), context=context):
                pass
        assert target in info.value.message and "supports_multimodal" in info.value.message
        assert peer.generated == 0  # refused before anything was sent
    finally:
        await channel.close()
        await server.stop(None)
