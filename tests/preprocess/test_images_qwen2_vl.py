"""A second family, Qwen2-VL (dynamic resolution), proven against transformers' own processor.

This machine's vLLM cannot load Qwen2-VL (its image processor imports torchvision, which the
CPU build's torch cannot use; field.md), so the proof is transformers' ``Qwen2VLProcessor``
with its PIL image processor, run offline on the same folder: the Qwen2.5 tokenizer of
tests/data (which carries the vision tokens) with Qwen2-VL's chat template and small pixel
bounds. Its ids must equal the Preprocessor's for every size, and each item's placeholder range
must be the run of ``<|image_pad|>`` tokens.
"""

from __future__ import annotations

import base64
import io
import json
import shutil

import pytest

from tokenkeys.preprocess.images import ImageOptions
from tokenkeys.preprocess.preprocessor import Preprocessor
from tokenkeys.tokenizer import Tokenizer

from conformance_data import data_path

PIL = pytest.importorskip("PIL.Image")

# Qwen2-VL-Instruct's chat template (Qwen/Qwen2-VL-7B-Instruct, Apache-2.0), images only.
TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PREPROCESSOR = {
    "processor_class": "Qwen2VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessor",
    "min_pixels": 3136,
    "max_pixels": 200704,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
}
SIZES = [(16, 16), (64, 64), (300, 200), (1024, 768), (768, 1024), (17, 333), (640, 28), (512, 512)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen2-vl")
    source = data_path("tokenizers", "qwen2.5-instruct")
    shutil.copyfile(source / "tokenizer.json", out / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR), encoding="utf-8")
    processor = {"processor_class": "Qwen2VLProcessor"}
    (out / "processor_config.json").write_text(json.dumps(processor), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def reference(folder):
    """transformers' own steps: the image processor's grids, the processor's replacement text
    (``Qwen2VLProcessor.replace_image_token``, called on a stand-in holding the two attributes
    it reads: building the whole processor needs a video processor, which needs torchvision),
    and the tokenizer."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
    from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor

    settings = {k: v for k, v in PREPROCESSOR.items() if not k.endswith(("_class", "_type"))}
    image_processor = Qwen2VLImageProcessorPil(**settings)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    stand_in = SimpleNamespace(image_token="<|image_pad|>", image_processor=image_processor)

    def run(prompt: str, images: list) -> tuple[list[int], list]:
        inputs = image_processor(images=images)
        pieces = prompt.split("<|image_pad|>")
        text = pieces[0]
        for i, piece in enumerate(pieces[1:]):
            text += Qwen2VLProcessor.replace_image_token(stand_in, inputs, i) + piece
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return list(ids), list(inputs["image_grid_thw"])

    return run


def _png(size: tuple[int, int], seed: int) -> bytes:
    buffer = io.BytesIO()
    PIL.new("RGB", size, (seed * 30 % 256, 40, 90)).save(buffer, "PNG")
    return buffer.getvalue()


def _part(data: bytes) -> dict:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def test_qwen2_vl_expansion_equals_transformers(folder, reference) -> None:
    pre = Preprocessor(Tokenizer.load(folder), images=ImageOptions(model_id="Qwen/Qwen2-VL"))
    pad = pre.tokenizer.backend.token_to_id("<|image_pad|>")
    for n, size in enumerate(SIZES):
        images = [_png(size, n), _png(SIZES[-1 - n], n + 50)]
        content = [{"type": "text", "text": f"Two images, {n}:"}, *map(_part, images)]
        chat = {"messages": [{"role": "user", "content": content}], "add_generation_prompt": True}
        ours = pre.tokenize_chat(chat)
        opened = [PIL.open(io.BytesIO(b)).convert("RGB") for b in images]
        ids, grids = reference(ours.prompt, opened)
        assert ours.tokens.ids == ids, size
        for feature, grid in zip(ours.features, grids, strict=True):
            run = ours.tokens.ids[feature.offset : feature.offset + feature.length]
            assert run == [pad] * feature.length
            assert feature.length == int(grid[0] * grid[1] * grid[2]) // 4
