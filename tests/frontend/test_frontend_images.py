"""Images through ``tokenkeys serve``'s HTTP routes: /tokenize, render (with features) and chat.

A real ``tokenkeys serve`` process on the SmolVLM-layout folder (tests/smolvlm_folder.py), the
simulated engine generating; images made with Pillow, as data: URLs and from a loopback HTTP
server. Every route answers what the one Preprocessor computes in process; refusals are 400 or
501 naming the field.
"""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from image_server import ImageServer
from served import Served
from smolvlm_folder import build_smolvlm_folder

from tokenkeys.preprocess.images import ImageOptions
from tokenkeys.preprocess.media.fetch import MediaPolicy
from tokenkeys.preprocess.preprocessor import Preprocessor
from tokenkeys.tokenizer import Tokenizer

PIL = pytest.importorskip("PIL.Image")
MODEL_ID = "/engines/tiny-smolvlm"


def _png(size: tuple[int, int], color: int) -> bytes:
    buffer = io.BytesIO()
    PIL.new("RGB", size, (color, 100, 200)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = build_smolvlm_folder(tmp_path_factory.mktemp("smolvlm"))
    images = ImageServer({"/a.png": _png((300, 200), 1)})
    args = ["--model", str(folder), "--mm-model-id", MODEL_ID, "--allow-private-media-addresses"]
    args += ["--limit-images-per-prompt", "3"]
    policy = MediaPolicy(allow_private_addresses=True)
    pre = Preprocessor(
        Tokenizer.load(folder), images=ImageOptions(model_id=MODEL_ID, policy=policy)
    )
    with Served(*args) as served:
        yield f"http://{served.http_address}", images, pre
    images.close()


def _chat(images: ImageServer, *, bad: str | None = None) -> dict:
    data = "data:image/png;base64," + base64.b64encode(_png((64, 64), 2)).decode()
    return {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Two pictures:"},
                    {"type": "image_url", "image_url": {"url": bad or data}},
                    {"type": "image_url", "image_url": {"url": images.url + "/a.png"}},
                ],
            }
        ],
        "add_generation_prompt": True,
    }


def test_tokenize_render_and_usage_equal_the_preprocessor(setup) -> None:
    url, images, pre = setup
    chat = _chat(images)
    want = pre.tokenize_chat(chat)
    tokenized = httpx.post(f"{url}/tokenize", json=chat, timeout=60)
    assert tokenized.status_code == 200, tokenized.text
    assert tokenized.json()["tokens"] == want.tokens.ids
    render = httpx.post(
        f"{url}/v1/chat/completions/render", json={**chat, "mm_payload": "none"}, timeout=60
    )
    assert render.status_code == 200, render.text
    answer = render.json()
    assert answer["token_ids"] == want.tokens.ids
    assert answer["features"] == {
        "mm_hashes": {"image": [f.identifier for f in want.features]},
        "mm_placeholders": {
            "image": [{"offset": f.offset, "length": f.length} for f in want.features]
        },
        "kwargs_data": None,
        "mm_metadata": None,
    }
    generated = httpx.post(f"{url}/v1/chat/completions", json={**chat, "max_tokens": 2}, timeout=60)
    assert generated.status_code == 200, generated.text
    assert generated.json()["usage"]["prompt_tokens"] == len(want.tokens.ids)


def test_generation_keys_the_images(setup) -> None:
    """The simulated engine keys image blocks with the items: another image, other keys."""
    url, images, pre = setup
    chat = _chat(images)
    other = _chat(
        images, bad="data:image/png;base64," + base64.b64encode(_png((64, 64), 9)).decode()
    )
    assert pre.tokenize_chat(chat).tokens.ids == pre.tokenize_chat(other).tokens.ids
    first = httpx.post(f"{url}/v1/chat/completions", json={**chat, "max_tokens": 1}, timeout=60)
    again = httpx.post(f"{url}/v1/chat/completions", json={**other, "max_tokens": 1}, timeout=60)
    same = httpx.post(f"{url}/v1/chat/completions", json={**chat, "max_tokens": 1}, timeout=60)
    assert first.status_code == again.status_code == same.status_code == 200, again.text

    def cached(answer: httpx.Response) -> int:
        return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    start = pre.tokenize_chat(other).features[0].offset
    assert cached(again) <= start, "blocks of another image were served from the cache"
    assert cached(same) > start + 32, "the same image's blocks were not cached"


def test_anthropic_image_blocks_go_the_same_way(setup) -> None:
    """An Anthropic image block is the chat's image part (preprocess/anthropic.py converts it)."""
    url, _, pre = setup
    data = base64.b64encode(_png((100, 80), 5)).decode()
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    body = {
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [block, {"type": "text", "text": "What?"}]}],
    }
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
    chat = {
        "messages": [{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}],
        "add_generation_prompt": True,
    }
    model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
    counted = httpx.post(
        f"{url}/v1/messages/count_tokens", json={**body, "model": model}, timeout=60
    )
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] == len(pre.tokenize_chat(chat).tokens.ids)
    # The Messages render answers the chat's features when it asks for no tensors, as vLLM's
    # (the choice is the Messages request's own; test_vllm_images compares it with vLLM).
    for choice in ({"mm_payload": "none"}, {"return_mm_kwargs": False}):
        request = {**body, "model": model, **choice}
        rendered = httpx.post(f"{url}/v1/messages/render", json=request, timeout=60)
        assert rendered.status_code == 200, rendered.text
        want = pre.tokenize_chat(chat).features
        assert rendered.json()["features"]["mm_hashes"] == {"image": [f.identifier for f in want]}
    tensors = httpx.post(f"{url}/v1/messages/render", json={**body, "model": model}, timeout=60)
    assert tensors.status_code == 501 and "mm_payload" in tensors.text


def test_refusals_name_the_field(setup) -> None:
    url, images, _ = setup
    tensors = httpx.post(f"{url}/v1/chat/completions/render", json=_chat(images), timeout=60)
    assert tensors.status_code == 501 and "mm_payload" in tensors.text
    alias = {**_chat(images), "return_mm_kwargs": False}  # vLLM's deprecated "none"
    rendered = httpx.post(f"{url}/v1/chat/completions/render", json=alias, timeout=60)
    assert rendered.status_code == 200 and rendered.json()["features"]["kwargs_data"] is None
    corrupt = "data:image/png;base64," + base64.b64encode(b"not an image").decode()
    for bad, status, words in (
        (corrupt, 400, "messages[0].content[1].image_url"),
        (images.url + "/missing.png", 400, "answered 404"),
        ("file:///etc/passwd", 400, "allowed local media path"),
    ):
        answer = httpx.post(f"{url}/tokenize", json=_chat(images, bad=bad), timeout=60)
        assert answer.status_code == status, answer.text
        assert words in answer.json()["error"]["message"]
    many = _chat(images)
    many["messages"][0]["content"] *= 2
    answer = httpx.post(f"{url}/tokenize", json=many, timeout=60)
    assert answer.status_code == 400 and "At most 3 image" in answer.text
    part = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AA=="}}
    video = {"messages": [{"role": "user", "content": [part]}]}
    answer = httpx.post(f"{url}/tokenize", json=video, timeout=60)
    assert answer.status_code == 501 and "video" in answer.text
