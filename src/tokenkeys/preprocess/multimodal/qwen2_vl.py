"""Qwen2-VL image placeholders: one ``<|image_pad|>`` becomes the image's grid of merged patches.

transformers' ``Qwen2VLProcessor.replace_image_token`` (and vLLM's Qwen2-VL processor, which
replaces the pad token by the same run) expands the template's single ``<|image_pad|>`` into
``grid_t * grid_h * grid_w // merge_size**2`` pad tokens. The grid comes from the model's image
processor (``get_number_of_image_patches``: ``smart_resize`` to multiples of
``patch_size * merge_size`` between ``min_pixels`` and ``max_pixels``; one temporal patch for an
image). The placeholder range is the pad run (the ``<|vision_start|>`` and ``<|vision_end|>``
around it are the template's text). Proven against transformers' processor run offline; this
machine's vLLM cannot load Qwen2-VL (its image processor imports torchvision).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenkeys.errors import ConfigError, Unsupported

PROCESSOR_CLASS = "Qwen2VLProcessor"
IMAGE_TOKEN = "<|image_pad|>"


class Qwen2VLImages:
    """The pad run of one image of a given size, from the model's preprocessor config."""

    placeholder = IMAGE_TOKEN

    def __init__(self, processor: Mapping[str, Any], preprocessor: Mapping[str, Any]) -> None:
        try:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
                Qwen2VLImageProcessorPil,
            )
        except ImportError as exc:
            raise Unsupported(
                f"Qwen2-VL images need transformers' Qwen2-VL image processor ({exc}); install "
                "tokenkeys[multimodal]",
                field="image_url",
            ) from None
        settings = {
            k: v
            for k, v in preprocessor.items()
            if k not in ("processor_class", "image_processor_type")
        }
        try:
            self._image_processor = Qwen2VLImageProcessorPil(**settings)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"preprocessor_config.json is not a Qwen2-VL image processor's: {exc}",
                field="preprocessor_config.json",
            ) from None
        self.merge_size = int(self._image_processor.merge_size)

    def text(self, width: int, height: int) -> str:
        """The pad tokens that replace the image's one pad token."""
        patches = self._image_processor.get_number_of_image_patches(height, width)
        return IMAGE_TOKEN * (patches // self.merge_size**2)
