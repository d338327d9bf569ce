"""Bad images through ``tokenkeys serve``'s generation route: a 400 naming the field, the fetch
bounded, nothing half done (issue 35).

A real ``tokenkeys serve`` (SmolVLM-layout folder, the simulated engine generating) under tight
media options: 4096 pixels, two images per prompt, 100,000 bytes, a 1 s fetch timeout (2 s
deadline), images only from ``127.0.0.1`` (private addresses allowed, as a deployment beside its
image store would). Images come from a loopback HTTP server (tests/image_server.py). Each bad
request is a 400 whose error names the part (``messages[0].content[1].image_url``) or
``messages``, and leaves no trace in the engine: the prompt-token counter of the generation
route does not move. The redirect to a loopback address under the default policy is proven at
the fetch (``tests/preprocess/test_images.py``: no public host is reachable here).
"""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from image_server import ImageServer
from prometheus_client.parser import text_string_to_metric_families
from served import Served
from smolvlm_folder import build_smolvlm_folder

PIL = pytest.importorskip("PIL.Image")
PART = "messages[0].content[1].image_url"


def _png(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    PIL.new("RGB", size, (10, 100, 200)).save(buffer, "PNG")
    return buffer.getvalue()


def _data(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = build_smolvlm_folder(tmp_path_factory.mktemp("smolvlm"))
    images = ImageServer({"/a.png": _png((32, 32)), "/big.png": b"\0" * 200_000})
    args = ["--model", f"vlm={folder}", "--mm-model-id", "/engines/vlm"]
    args += ["--allow-private-media-addresses", "--allowed-media-domains", "127.0.0.1"]
    args += ["--max-image-pixels", "4096", "--limit-images-per-prompt", "2"]
    args += ["--max-media-bytes", "100000", "--media-fetch-timeout", "1"]
    try:
        with Served(*args) as served:
            yield f"http://{served.http_address}", images
    finally:
        images.close()


def _chat(*urls: str) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    content = [{"type": "text", "text": "Look:"}, *parts]
    return {"model": "vlm", "messages": [{"role": "user", "content": content}], "max_tokens": 1}


def _prompt_tokens(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tokenkeys_prompt_tokens_total"
    )


def _bad_cases(images: ImageServer) -> list[tuple[str, dict, str, str]]:
    """(label, body, the field the error names, words of its message)."""
    local = images.url.replace("127.0.0.1", "localhost")
    return [
        ("corrupt", _chat(_data(b"\x89PNG not really")), PART, "image"),
        ("over-the-pixel-cap", _chat(_data(_png((65, 64)))), PART, "4096 pixels"),
        ("outside-the-allowlist", _chat(local + "/a.png"), PART, "allowed domains"),
        (
            "redirect-outside-the-allowlist",
            _chat(images.url + "/away?" + local + "/a.png"),
            PART,
            "allowed domains",
        ),
        ("slow-server", _chat(images.url + "/slow"), PART, "timed out"),
        ("trickling-server", _chat(images.url + "/trickle"), PART, "took longer than 2 s"),
        ("too-many-bytes", _chat(images.url + "/big.png"), PART, "at most 100000"),
        ("endless-body", _chat(images.url + "/endless"), PART, "more than 100000 bytes"),
        (
            "too-many-images",
            _chat(*[images.url + "/a.png"] * 3),
            "messages",
            "At most 2 image",
        ),
    ]


def test_bad_images_are_400_naming_the_field_and_leave_nothing_done(setup) -> None:
    url, images = setup
    before = _prompt_tokens(url)
    for label, body, field, words in _bad_cases(images):
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 400, (label, answer.text)
        error = answer.json()["error"]
        assert error["param"] == field, (label, error)
        assert words in error["message"], (label, error)
    assert _prompt_tokens(url) == before  # the engine ran none of them
    good = httpx.post(f"{url}/v1/chat/completions", json=_chat(images.url + "/a.png"), timeout=60)
    assert good.status_code == 200, good.text
    assert _prompt_tokens(url) == before + good.json()["usage"]["prompt_tokens"]
