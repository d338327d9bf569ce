"""vLLM 0.32's multimodal identifier, reproduced byte for byte.

The vectors in tests/data/vectors/vllm-mm-identifiers were written by vLLM 0.32's own loader and
hasher (``ImageMediaIO().load_bytes`` then ``MultiModalHasher.hash_kwargs``, run by the engine
environment: ``tests/realengine/vllm_mm_hash.py --vectors``) over images of every mode vLLM
keeps or converts, three model ids and the three hash algorithms. tokenkeys decodes each file
itself (which decides whether vLLM converted it) and hashes it; both must equal vLLM's.
"""

from __future__ import annotations

import base64
import json

import pytest

from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.keys.vllm_mm import (
    ImageConversion,
    image_identifier,
    image_stream,
    uuid_identifier,
)
from tokenkeys.preprocess.media.decode import decode_image

from conformance_data import data_path

VECTORS = json.loads(
    (data_path("vectors", "vllm-mm-identifiers") / "vllm-0.32.json").read_text(encoding="utf-8")
)
CASES = VECTORS["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['name']}-{c['algorithm']}" for c in CASES])
def test_identifier_equals_vllms(case: dict) -> None:
    data = base64.b64decode(case["data"])
    decoded = decode_image(data, field="image_url")
    assert decoded.converted == case["converted"]
    conversion = ImageConversion() if decoded.converted else None
    got = image_identifier(data, case["model_id"], conversion, algorithm=case["algorithm"])
    assert got == case["identifier"]


def test_the_vectors_cover_conversion_and_every_algorithm() -> None:
    assert {c["converted"] for c in CASES} == {True, False}
    assert {c["algorithm"] for c in CASES} == {"blake3", "sha256", "sha512"}


def test_the_stream_is_framed_and_sorted() -> None:
    stream = b"".join(image_stream(b"\x89PNG", "m"))
    eight = (5).to_bytes(8, "little")
    assert stream == (
        eight + b"image" + b"\x03" + eight + b"image" + b"\x03" + (4).to_bytes(8, "little")
        + b"\x89PNG" + (8).to_bytes(8, "little") + b"model_id" + b"\x03"
        + (1).to_bytes(8, "little") + b"m"
    )  # fmt: skip


def test_the_model_id_and_the_conversion_change_the_identifier() -> None:
    a = image_identifier(b"bytes", "/models/a")
    assert a != image_identifier(b"bytes", "/models/b")
    assert a != image_identifier(b"bytes", "/models/a", ImageConversion())
    assert ImageConversion((0, 0, 0)) != ImageConversion()


def test_what_is_not_reproduced_is_refused() -> None:
    with pytest.raises(Unsupported, match="vLLM 0.31"):
        image_identifier(b"x", "m", release="0.31")
    with pytest.raises(InvalidArgument, match="md5"):
        image_identifier(b"x", "m", algorithm="md5")
    with pytest.raises(Unsupported, match="'L'"):
        image_identifier(b"x", "m", ImageConversion(image_mode="L"))


def test_a_uuid_is_the_identifier() -> None:
    assert uuid_identifier("my-image-7") == "my-image-7"
    with pytest.raises(InvalidArgument) as err:
        uuid_identifier("")
    assert err.value.field == "uuid"


def test_a_corrupt_image_names_the_field() -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_image(b"\x89PNG\r\n\x1a\nnot really", field="messages[0].content[1].image_url")
    assert err.value.field == "messages[0].content[1].image_url"
