"""Image chats through the front door: the router keys them as its workers do (issue 35).

Two simulated engines serve the SmolVLM-layout folder (tests/smolvlm_folder.py) with their HTTP
frontends, each hashing images with the engine model id ``MODEL_ID`` (``serve --mm-model-id``):
their cards on ``/v1/models`` state it as their ``root``, as a sidecar states its vLLM's. The
router behind learns it from there, keys each image chat with vLLM 0.32's per-block image extra
keys and routes by them: its promise (``x-tokenkeys-expected-cached-tokens``) is what the worker
serves, block for block, image-bearing blocks included, so its keys are the worker's own (the
worker keys with its Preprocessor's features, as the sidecar does). Another image of the same
size (the same placeholder tokens) is promised nothing past the text before it. A router whose
``--mm-model-id`` contradicts the workers', and workers that state no id, route image chats by
load and forward them unchanged, as do two workers that state different ids.
"""

from __future__ import annotations

import base64
import io
import logging

import httpx
import pytest
from routing_support import start_cluster
from smolvlm_folder import build_smolvlm_folder

from tokenkeys.keys import make_spec
from tokenkeys.keys.deployment import DEFAULT_PROFILE
from tokenkeys.limits import Limits
from tokenkeys.preprocess.images import ImageOptions
from tokenkeys.preprocess.preprocessor import Preprocessor
from tokenkeys.router.workers.pool_setup import PoolSettings
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import ModelRegistry, attach_cache_keys
from tokenkeys.tokenizer import Tokenizer, TokenizerOptions

PIL = pytest.importorskip("PIL.Image")
MODEL_ID = "/engines/tiny-smolvlm"
BLOCK = 16


def _png(size: tuple[int, int], color: int) -> str:
    buffer = io.BytesIO()
    PIL.new("RGB", size, (color, 100, 200)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _user(text: str, image: str | None = None) -> dict:
    content: list[dict] = [{"type": "text", "text": text}]
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": image}})
    return {"role": "user", "content": content}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_smolvlm_folder(tmp_path_factory.mktemp("smolvlm"))


def _models(folder, model_ids: tuple[str | None, ...]):  # noqa: ANN001, ANN202
    """The served models of each engine in turn, hashing images with its id of ``model_ids``."""
    ids = iter(model_ids)

    def make() -> ModelRegistry:
        models = load_models(
            [ModelSource("smolvlm", folder)],
            TokenizerOptions(),
            Limits(),
            images=ImageOptions(model_id=next(ids)),
        )
        attach_cache_keys(models, make_spec(DEFAULT_PROFILE, BLOCK), Limits())
        return models

    return make


async def _cluster(folder, tmp_path, *, workers_id, router_id: str | None = None):  # noqa: ANN001, ANN202
    settings = PoolSettings(cache=tmp_path / "cache", images=ImageOptions(model_id=router_id))
    return await start_cluster(
        2,
        settings=settings,
        http=True,
        worker_http=True,
        models=_models(folder, workers_id if isinstance(workers_id, tuple) else (workers_id,) * 2),
    )


async def _chat(client: httpx.AsyncClient, messages: list[dict]) -> httpx.Response:
    body = {"model": "smolvlm", "messages": messages, "max_tokens": 4}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def _cached(response: httpx.Response) -> int:
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_image_conversations_go_to_their_holder_and_keep_the_promise(folder, tmp_path):
    cluster = await _cluster(folder, tmp_path, workers_id=MODEL_ID)
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=60) as client:
            for n in range(2):  # two conversations, each with its own image
                messages = [_user(f"Conversation {n}: what is this?", _png((64, 64), n))]
                holder = None
                for turn in range(3):
                    response = await _chat(client, messages)
                    served = _cached(response)
                    expected = int(response.headers["x-tokenkeys-expected-cached-tokens"])
                    assert expected == served, (n, turn)  # the router's keys are the worker's
                    if turn:
                        assert response.headers["x-tokenkeys-worker"] == holder
                        assert response.headers["x-tokenkeys-reason"] == "prefix"
                        assert served > 272  # past the image's 272 image tokens
                    holder = response.headers["x-tokenkeys-worker"]
                    answer = response.json()["choices"][0]["message"]["content"]
                    messages += [
                        {"role": "assistant", "content": answer},
                        _user(f"And turn {turn + 1}?"),
                    ]
                    await cluster.settle()
            cards = (await client.get("/v1/models")).json()["data"]
            assert [c["root"] for c in cards] == [MODEL_ID]  # learned from the workers
            # The same text with another image of the same size: the same placeholder tokens,
            # but other image keys, so nothing past the text before the image is promised.
            first = [_user("Conversation 0: what is this?", _png((64, 64), 0))]
            other = [_user("Conversation 0: what is this?", _png((64, 64), 99))]
            decided = (await client.post("/router/route", json={"messages": first})).json()
            again = (await client.post("/router/route", json={"messages": other})).json()
            assert decided["reason"] == "prefix", decided
            assert decided["matched_blocks"] == decided["total_blocks"] > 272 // BLOCK
            pre = Preprocessor(Tokenizer.load(folder), images=ImageOptions(model_id=MODEL_ID))
            image_start = pre.tokenize_chat({"messages": other}).features[0].offset
            assert again["matched_blocks"] == image_start // BLOCK  # the text before it
    finally:
        await cluster.close()


@pytest.mark.parametrize(
    ("workers_id", "router_id"),
    [
        (None, None),  # no worker states its engine's model id
        (MODEL_ID, "/another/path/to/the/model"),  # route --mm-model-id contradicts them
        ((MODEL_ID, "/another/path/to/the/model"), None),  # the two workers disagree
    ],
)
async def test_images_without_one_known_model_id_are_routed_by_load(
    folder, tmp_path, caplog, workers_id, router_id
):
    cluster = await _cluster(folder, tmp_path, workers_id=workers_id, router_id=router_id)
    try:
        async with httpx.AsyncClient(base_url=cluster.url, timeout=60) as client:
            messages = [_user("What is this?", _png((64, 64), 5))]
            with caplog.at_level(logging.ERROR, "tokenkeys.router.forwarding.image_ids"):
                for _ in range(2):
                    body = {"model": "smolvlm", "messages": messages, "max_tokens": 2}
                    routed = await client.post("/v1/chat/completions", json=body)
                    assert routed.headers["x-tokenkeys-reason"] == "load", routed.text
                    assert routed.headers["x-tokenkeys-matched-blocks"] == "0/0"
                    worker = routed.headers["x-tokenkeys-worker"]
                    stack = cluster.stacks[cluster.number(worker)]
                    straight = await client.post(
                        f"http://127.0.0.1:{stack.serving.http_port}/v1/chat/completions",
                        json=body,
                    )
                    # Forwarded unchanged: the worker's own answer (its 400 without an id).
                    assert routed.status_code == straight.status_code
            contradicted = "hash images with different model ids" in caplog.text
            assert contradicted == (workers_id is not None), caplog.text
    finally:
        await cluster.close()
