"""Images on the one path: the Preprocessor's expansion equals transformers' own Idefics3Processor.

The SmolVLM-layout folder (tests/smolvlm_folder.py) is built offline; transformers' processor
(its PIL image processor and ``Idefics3Processor``, run offline on the same folder) expands the
same rendered prompt with the same images, and its ids must equal the Preprocessor's, for every
size and aspect ratio, several images per message and images in earlier turns. The real-engine
proof against vLLM 0.32 is separate (field.md: vLLM agreed with this processor in every case).
"""

from __future__ import annotations

import base64
import io

import pytest
from image_server import ImageServer
from smolvlm_folder import IMAGE_SEQ_LEN, PREPROCESSOR, build_smolvlm_folder

from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.keys.vllm_mm import ImageConversion, image_identifier
from tokenkeys.preprocess.chat_messages import media_kind
from tokenkeys.preprocess.images import ImageOptions
from tokenkeys.preprocess.media import fetch
from tokenkeys.preprocess.media.fetch import MediaPolicy, load_url
from tokenkeys.preprocess.preprocessor import Preprocessor
from tokenkeys.tokenizer import Tokenizer

PIL = pytest.importorskip("PIL.Image")
MODEL_ID = "/models/tiny-smolvlm"

SIZES = [
    (16, 16), (64, 64), (100, 80), (300, 200), (300, 100), (1024, 768), (768, 1024), (17, 333),
    (640, 7), (255, 256), (129, 65), (512, 512),
]  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_smolvlm_folder(tmp_path_factory.mktemp("smolvlm"))


@pytest.fixture(scope="module")
def pre(folder) -> Preprocessor:
    return Preprocessor(Tokenizer.load(folder), images=ImageOptions(model_id=MODEL_ID))


@pytest.fixture(scope="module")
def reference(folder):
    """transformers' own processor for the folder, run offline."""
    from transformers import AutoTokenizer
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    settings = {k: v for k, v in PREPROCESSOR.items() if not k.endswith(("_class", "_type"))}
    return Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(**settings),
        tokenizer=AutoTokenizer.from_pretrained(str(folder)),
        image_seq_len=IMAGE_SEQ_LEN,
    )


def encoded(size: tuple[int, int], fmt: str = "PNG", mode: str = "RGB", seed: int = 0) -> bytes:
    image = PIL.new(mode, size, (seed * 40 % 256, 90, 200)[: len(mode)] if mode != "L" else 90)
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def image_part(url: str, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": url}, **extra}


def chat(*turns: list) -> dict:
    roles = ("user", "assistant")
    return {
        "messages": [{"role": roles[i % 2], "content": c} for i, c in enumerate(turns)],
        "add_generation_prompt": True,
    }


def expected_ids(reference, prompt: str, images: list[bytes]) -> list[int]:
    opened = [PIL.open(io.BytesIO(b)).convert("RGB") for b in images]
    out = reference(text=[prompt], images=[opened] if opened else None)
    return list(out["input_ids"][0])


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_one_image_equals_transformers(pre, reference, size) -> None:
    data = encoded(size)
    result = pre.tokenize_chat(chat([image_part(data_url(data)), {"type": "text", "text": "Hi"}]))
    assert result.tokens.ids == expected_ids(reference, result.prompt, [data])
    (feature,) = result.features
    assert feature.identifier == image_identifier(data, MODEL_ID)
    run = result.tokens.ids[feature.offset : feature.offset + feature.length]
    fake = pre.tokenizer.backend.token_to_id("<fake_token_around_image>")
    assert run[0] == fake and run[-1] == fake
    assert feature.offset + feature.length < len(result.tokens.ids)


def test_several_images_and_earlier_turns_equal_transformers(pre, reference) -> None:
    images = [encoded((300, 200), "JPEG"), encoded((64, 64)), encoded((16, 300), seed=3)]
    request = chat(
        [image_part(data_url(images[0], "image/jpeg")), {"type": "text", "text": "What?"}],
        "A cat.",
        [
            {"type": "text", "text": "And these two?"},
            image_part(data_url(images[1])),
            image_part(data_url(images[2])),
        ],
    )
    result = pre.tokenize_chat(request)
    assert result.tokens.ids == expected_ids(reference, result.prompt, images)
    offsets = [f.offset for f in result.features]
    assert offsets == sorted(offsets) and len(result.features) == 3
    for a, b in zip(result.features, result.features[1:], strict=False):
        assert a.offset + a.length <= b.offset


def test_a_converted_image_and_a_uuid(pre) -> None:
    rgba = encoded((40, 30), mode="RGBA")
    result = pre.tokenize_chat(
        chat([image_part(data_url(rgba)), image_part(data_url(rgba), uuid="client-7")])
    )
    first, second = result.features
    assert first.identifier == image_identifier(rgba, MODEL_ID, ImageConversion())
    assert second.identifier == "client-7"
    assert first.item().identifier == first.identifier


def test_no_model_id_counts_but_leaves_identifiers_unset(folder) -> None:
    pre = Preprocessor(Tokenizer.load(folder))
    result = pre.tokenize_chat(chat([image_part(data_url(encoded((64, 64))))]))
    (feature,) = result.features
    assert feature.identifier is None
    with pytest.raises(Exception, match="model id"):
        feature.item()


def test_video_and_audio_name_the_modality(pre) -> None:
    for part, modality in (
        ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AA=="}}, "video"),
        ({"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}, "audio"),
    ):
        with pytest.raises(Unsupported, match=f"^{modality} input is not supported"):
            pre.tokenize_chat(chat([part]))


def test_a_text_only_model_refuses_images_as_vllm_does() -> None:
    # vLLM 0.32: 400 "<served name> is not a multimodal model", before fetching the image (so
    # a malformed one, or one it could not fetch, gets the same answer).
    from tokenkeys.tokenizer.embedded import default_tokenizer_path

    pre = Preprocessor(Tokenizer.load(default_tokenizer_path()), model="m")
    for url in (data_url(encoded((8, 8))), "data:image/png;base64,", "http://10.0.0.1/a.png"):
        with pytest.raises(InvalidArgument, match="m is not a multimodal model") as raised:
            pre.tokenize_chat(chat([{"type": "text", "text": "x"}, image_part(url)]))
        assert raised.value.field == "messages[0].content[1]"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
        {"image_url": "http://x/y.png"},  # no type, recognised by its key
    ],
)
def test_an_image_for_a_model_without_an_image_processor_is_a_bad_request(part: dict) -> None:
    # vLLM 0.32 answers 400 "<model> is not a multimodal model" (checked against the real
    # engine in tests/realengine/test_vllm_messages.py).
    from tokenkeys.tokenizer.embedded import default_tokenizer_path

    pre = Preprocessor(Tokenizer.load(default_tokenizer_path()), model="m")
    assert media_kind(part) == "image_url"
    with pytest.raises(InvalidArgument) as info:
        pre.tokenize_chat(chat([{"type": "text", "text": "see"}, part]))
    assert "not a multimodal model" in info.value.message
    assert info.value.field == "messages[0].content[1]"


def test_another_processor_class_is_refused_by_name(folder, tmp_path) -> None:
    import json
    import shutil

    other = tmp_path / "other"
    shutil.copytree(folder, other)
    (other / "processor_config.json").write_text(json.dumps({"processor_class": "LlavaProcessor"}))
    (other / "preprocessor_config.json").unlink()
    pre = Preprocessor(Tokenizer.load(other))
    with pytest.raises(Unsupported, match="LlavaProcessor"):
        pre.tokenize_chat(chat([image_part(data_url(encoded((8, 8))))]))
    assert pre.tokenize_chat(chat("text only")).tokens.ids


def test_bad_images_get_400_naming_the_field(pre, folder) -> None:
    where = "messages[0].content[1].image_url"
    for url in ("data:image/png;base64,bm90IGFuIGltYWdl", "data:image/png,raw", "ftp://x/y.png"):
        with pytest.raises(InvalidArgument) as err:
            pre.tokenize_chat(chat([{"type": "text", "text": "x"}, image_part(url)]))
        assert err.value.field == where
    capped = Preprocessor(
        Tokenizer.load(folder), images=ImageOptions(model_id=MODEL_ID, max_pixels=100)
    )
    with pytest.raises(InvalidArgument, match="exceed the maximum of 100 pixels"):
        capped.tokenize_chat(chat([image_part(data_url(encoded((11, 10))))]))
    limited = Preprocessor(
        Tokenizer.load(folder), images=ImageOptions(model_id=MODEL_ID, limit_per_prompt=1)
    )
    two = chat([image_part(data_url(encoded((8, 8)))), image_part(data_url(encoded((8, 8))))])
    with pytest.raises(InvalidArgument, match="At most 1 image") as err:
        limited.tokenize_chat(two)
    assert err.value.field == "messages"


def test_a_placeholder_typed_in_text_is_refused(pre) -> None:
    request = chat(
        [{"type": "text", "text": "look <image>"}, image_part(data_url(encoded((8, 8))))]
    )
    with pytest.raises(InvalidArgument, match="2 <image> placeholder"):
        pre.tokenize_chat(request)


@pytest.fixture
def server():
    s = ImageServer({"/img.png": encoded((64, 64))})
    yield s
    s.close()


def test_http_fetch_under_the_policy(server, tmp_path) -> None:
    where = "messages[0].content[0].image_url"
    with pytest.raises(InvalidArgument, match="loopback"):
        load_url(server.url + "/img.png", MediaPolicy(), where=where)
    allowed = MediaPolicy(allow_private_addresses=True)
    assert load_url(server.url + "/img.png", allowed, where=where) == encoded((64, 64))
    assert load_url(server.url + "/redirect", allowed, where=where) == encoded((64, 64))
    private = {"allow_private_addresses": True}
    refusals = (
        ("/redirect", {**private, "max_redirects": 0}, "more than 0 redirects"),
        ("/img.png", {"allowed_media_domains": ("example.com",)}, "allowed domains"),
        ("/img.png", {**private, "max_bytes": 10}, "more than 10 bytes|at most 10"),
        ("/slow", {**private, "read_timeout": 0.3}, "timed out"),
    )
    for path, options, message in refusals:
        with pytest.raises(InvalidArgument, match=message) as err:
            load_url(server.url + path, MediaPolicy(**options), where=where)
        assert err.value.field == where


def test_a_redirect_to_loopback_is_refused(monkeypatch) -> None:
    # A stand-in for a public image host (no public address is reachable here): a server on
    # 127.0.0.2 that the address check is told to take as public. It redirects to 127.0.0.1.
    monkeypatch.setattr(fetch, "_public", lambda address: str(address) == "127.0.0.2")
    target = ImageServer({"/img.png": encoded((8, 8))})
    public = ImageServer({}, host="127.0.0.2")
    where = "messages[0].content[0].image_url"
    try:
        # The stand-in passes the check: fetched, its redirect followed, its 404 reported.
        with pytest.raises(InvalidArgument, match="answered 404"):
            load_url(public.url + "/away?" + public.url + "/missing", MediaPolicy(), where=where)
        with pytest.raises(InvalidArgument, match="127.0.0.1, a private, loopback") as err:
            load_url(public.url + "/away?" + target.url + "/img.png", MediaPolicy(), where=where)
        assert err.value.field == where
    finally:
        target.close()
        public.close()


def test_unbounded_bodies_are_cut_at_the_byte_cap_and_the_deadline(server) -> None:
    where = "w"
    private = {"allow_private_addresses": True}
    with pytest.raises(InvalidArgument, match="more than 100000 bytes"):
        load_url(server.url + "/endless", MediaPolicy(**private, max_bytes=100_000), where=where)
    policy = MediaPolicy(**private, read_timeout=1.0, deadline=0.5)
    with pytest.raises(InvalidArgument, match="took longer than 0.5 s"):
        load_url(server.url + "/trickle", policy, where=where)


def test_file_urls_only_under_the_allowed_path(tmp_path) -> None:
    inside = tmp_path / "media"
    inside.mkdir()
    (inside / "a.png").write_bytes(encoded((8, 8)))
    (tmp_path / "b.png").write_bytes(encoded((8, 8)))
    where = "w"
    with pytest.raises(InvalidArgument, match="allowed local media path"):
        load_url(f"file://{inside}/a.png", MediaPolicy(), where=where)
    policy = MediaPolicy(allowed_local_media_path=inside)
    assert load_url(f"file://{inside}/a.png", policy, where=where) == encoded((8, 8))
    with pytest.raises(InvalidArgument, match="must be inside"):
        load_url(f"file://{inside}/../b.png", policy, where=where)


def test_an_image_chat_over_http_equals_the_data_url_one(folder, server, reference) -> None:
    policy = MediaPolicy(allow_private_addresses=True)
    pre = Preprocessor(
        Tokenizer.load(folder), images=ImageOptions(model_id=MODEL_ID, policy=policy)
    )
    by_url = pre.tokenize_chat(chat([image_part(server.url + "/img.png")]))
    by_data = pre.tokenize_chat(chat([image_part(data_url(encoded((64, 64))))]))
    assert by_url.tokens.ids == by_data.tokens.ids
    assert by_url.features == by_data.features


def test_string_content_format_puts_missing_placeholders_first(folder) -> None:
    """vLLM's string format: the texts joined, each image's placeholder the text lacks in front."""
    from tokenkeys.preprocess.chat import ChatOptions

    options = ChatOptions(
        chat_template="{% for m in messages %}{{ m['content'] }}|{% endfor %}",
        content_format="string",
    )
    pre = Preprocessor(
        Tokenizer.load(folder), chat_options=options, images=ImageOptions(model_id=MODEL_ID)
    )
    two = [image_part(data_url(encoded((8, 8)))), image_part(data_url(encoded((9, 9))))]
    result = pre.tokenize_chat(chat([{"type": "text", "text": "Hi"}, *two]))
    assert result.prompt == "<image>\n<image>\nHi|"
    assert len(result.features) == 2
    placed = pre.tokenize_chat(chat([{"type": "text", "text": "a <image> b"}, *two]))
    assert placed.prompt == "<image>\na <image> b|"
    with pytest.raises(InvalidArgument, match="more '<image>' placeholders"):
        pre.tokenize_chat(chat([{"type": "text", "text": "<image><image><image>"}, *two]))
