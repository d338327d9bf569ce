"""vLLM 0.32's own multimodal processor, run offline, equals tokenkeys on every image chat.

No server: the engine environment runs vLLM's renderer steps for images
(``vllm_mm_process.py``: its tokenizer, ``ImageMediaIO`` and the model's multimodal processor from
``create_processor``) over a tiny SmolVLM's configs (``build_tiny_model.py --vlm-config``, no
weights). For each of the image chats (``image_chats``), tokenkeys renders the prompt and the
engine's code expands the same text with the same image files: the ids, the item hashes (vLLM
hashes its ``--model`` argument, here the folder path given to ``ModelConfig``) and the
placeholder ranges must all be equal; so must a client ``uuid`` and an image vLLM converts
(RGBA). The served proof (``/tokenize``, usage and BlockStored hashes of a running vLLM) is
``test_vllm_images.py``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from evidence import unavailable
from image_chats import Chats, _data_url
from smolvlm_folder import build_smolvlm_folder

from tokenkeys.preprocess.images import ImageOptions
from tokenkeys.preprocess.preprocessor import Preprocessor
from tokenkeys.tokenizer import Tokenizer

from cached_venv import VenvUnavailable
from vllm_env import vllm_python

PIL = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.realengine
HERE = Path(__file__).resolve().parent


def _engine(python: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(python), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**env, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, Path]:
    try:
        python = vllm_python()
    except VenvUnavailable as exc:
        unavailable(f"no vLLM engine environment: {exc}")
    base = tmp_path_factory.mktemp("vlm-config")
    tokenizer = build_smolvlm_folder(base / "tokenizer")
    builder = str(HERE / "build_tiny_model.py")
    _engine(python, builder, "--vlm-config", str(tokenizer), str(base / "vlm"))
    return python, base / "vlm"


def _rgba() -> bytes:
    buffer = io.BytesIO()
    PIL.new("RGBA", (90, 40), (10, 20, 30, 128)).save(buffer, "PNG")
    return buffer.getvalue()


def test_vllms_processor_equals_tokenkeys_on_every_chat(model) -> None:
    python, folder = model
    chats = Chats()
    requests = [chat for _, chat in chats.resolved("unused")]
    images = [
        [{"data": base64.b64encode(b).decode(), "uuid": None} for b in i] for i in chats.images
    ]
    # Every image as a data URL for tokenkeys (the engine takes the same files' bytes).
    for request, files in zip(requests, chats.images, strict=True):
        contents = [m["content"] for m in request["messages"] if isinstance(m["content"], list)]
        parts = [p for c in contents for p in c if p.get("type") == "image_url"]
        for part, data in zip(parts, files, strict=True):
            part["image_url"] = {"url": _data_url(data, "PNG")}
    rgba = _rgba()
    requests.append(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": _data_url(rgba, "PNG")}},
                        {
                            "type": "image_url",
                            "image_url": {"url": _data_url(rgba, "PNG")},
                            "uuid": "client-image-9",
                        },  # fmt: skip
                        {
                            "type": "text",
                            "text": "A converted image, then one named by the client.",
                        },
                    ],
                }
            ],
            "add_generation_prompt": True,
        }
    )
    encoded = base64.b64encode(rgba).decode()
    images.append([{"data": encoded, "uuid": None}, {"data": encoded, "uuid": "client-image-9"}])
    pre = Preprocessor(Tokenizer.load(folder), images=ImageOptions(model_id=str(folder)))
    ours = [pre.tokenize_chat(r) for r in requests]
    cases = [{"prompt": o.prompt, "images": i} for o, i in zip(ours, images, strict=True)]
    path = folder.parent / "cases.json"
    path.write_text(json.dumps(cases), encoding="utf-8")
    theirs = json.loads(_engine(python, str(HERE / "vllm_mm_process.py"), str(folder), str(path)))
    assert len(theirs) == len(ours) >= 31
    for n, (mine, engine) in enumerate(zip(ours, theirs, strict=True)):
        assert mine.tokens.ids == engine["ids"], n
        assert [f.identifier for f in mine.features] == engine["hashes"], n
        assert [[f.offset, f.length] for f in mine.features] == engine["placeholders"], n
