"""Idefics3 (SmolVLM) image placeholders, as vLLM 0.32 expands them.

vLLM 0.32 (``vllm/model_executor/models/idefics3.py``, ``Idefics3ProcessingInfo.get_image_repl``)
replaces each ``<image>`` token of the prompt with the text below, encoded without special
tokens: for every tile of the grid, row by row, ``<fake_token_around_image><row_R_col_C>`` then
``image_seq_len`` image tokens, a newline after each row; then a newline, the global image
``<fake_token_around_image><global-img>`` with its image tokens, and a closing
``<fake_token_around_image>``; an image that is not split is the global image alone. The grid
comes from the model's own image processor: transformers' Idefics3 image processor,
``get_number_of_image_patches(height, width)`` over its ``preprocessor_config.json``. The text is
built by transformers' ``Idefics3Processor.replace_image_token`` (the same string as vLLM's).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from tokenkeys.errors import ConfigError, Unsupported

PROCESSOR_CLASS = "Idefics3Processor"
IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TAG = "<global-img>"
# transformers' Idefics3Processor default when processor_config.json does not set it.
DEFAULT_IMAGE_SEQ_LEN = 169


def _transformers() -> tuple[Any, Any]:
    try:
        from transformers.models.idefics3.image_processing_pil_idefics3 import (
            Idefics3ImageProcessorPil,
        )
        from transformers.models.idefics3.processing_idefics3 import Idefics3Processor
    except ImportError as exc:
        raise Unsupported(
            f"Idefics3 images need transformers' Idefics3 processor ({exc}); install "
            "tokenkeys[multimodal]",
            field="image_url",
        ) from None
    return Idefics3ImageProcessorPil, Idefics3Processor


class Idefics3Images:
    """The placeholder text of one image of a given size, from the model's processor configs."""

    placeholder = IMAGE_TOKEN

    def __init__(self, processor: Mapping[str, Any], preprocessor: Mapping[str, Any]) -> None:
        image_processor_cls, processor_cls = _transformers()
        settings = {k: v for k, v in preprocessor.items() if not k.startswith("image_processor")}
        settings.pop("processor_class", None)
        try:
            self._image_processor = image_processor_cls(**settings)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"preprocessor_config.json is not an Idefics3 image processor's: {exc}",
                field="preprocessor_config.json",
            ) from None
        seq_len = processor.get("image_seq_len", DEFAULT_IMAGE_SEQ_LEN)
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ConfigError(
                f"processor_config.json image_seq_len must be a positive integer, got {seq_len!r}",
                field="processor_config.json",
            )
        self.image_seq_len = seq_len
        # replace_image_token reads only these attributes of the processor (transformers 5).
        self._processor = SimpleNamespace(
            fake_image_token=FAKE_IMAGE_TOKEN,
            image_token=IMAGE_TOKEN,
            global_image_tag=GLOBAL_IMAGE_TAG,
            image_seq_len=seq_len,
        )
        self._replace = processor_cls.replace_image_token

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """Rows and columns of tiles the image processor cuts the image into (0, 0: unsplit)."""
        _, rows, cols = self._image_processor.get_number_of_image_patches(height, width)
        return rows, cols

    def text(self, width: int, height: int) -> str:
        """The text that replaces the image's placeholder token."""
        rows, cols = self.grid(width, height)
        return self._replace(self._processor, {"rows": [[rows]], "cols": [[cols]]}, 0)
