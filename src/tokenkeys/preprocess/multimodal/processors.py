"""The multimodal processor of a served model, read from its tokenizer folder.

A folder with ``processor_config.json`` or ``preprocessor_config.json`` names its processor
class (``processor_class``); the classes whose expansion is reproduced exactly have a module
here. Any other class is refused when an image arrives (501 naming the class), so a model whose
expansion is unknown still serves text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from tokenkeys.errors import ConfigError, Unsupported

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


class ImageFamily(Protocol):
    """One processor family: the placeholder token a template emits and its expansion."""

    placeholder: str

    def text(self, width: int, height: int) -> str:
        """The text that replaces one image's placeholder token."""
        ...


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path.name} is not readable JSON: {exc}", field=path.name) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path.name} must hold a JSON object", field=path.name)
    return data


def processor_class(folder: Path) -> str | None:
    """The processor class a folder names, or None for a text-only tokenizer."""
    processor, preprocessor = (_read(folder / name) for name in PROCESSOR_FILES)
    if not processor and not preprocessor:
        return None
    name = processor.get("processor_class") or preprocessor.get("processor_class")
    return str(name) if name else "unnamed processor"


def image_family(folder: Path) -> ImageFamily:
    """The image expansion of a folder's processor; 501 naming a class not reproduced."""
    name = processor_class(folder)
    if name is None:
        raise Unsupported(
            "this model has no multimodal processor (no processor_config.json or "
            "preprocessor_config.json beside its tokenizer): images are not supported",
            field="image_url",
        )
    processor: Mapping[str, Any] = _read(folder / PROCESSOR_FILES[0])
    preprocessor: Mapping[str, Any] = _read(folder / PROCESSOR_FILES[1])
    if name == "Idefics3Processor":
        from tokenkeys.preprocess.multimodal.idefics3 import Idefics3Images

        return Idefics3Images(processor, preprocessor)
    if name == "Qwen2VLProcessor":
        from tokenkeys.preprocess.multimodal.qwen2_vl import Qwen2VLImages

        return Qwen2VLImages(processor, preprocessor)
    raise Unsupported(
        f"images for the processor class {name} are not supported: its placeholder expansion "
        "is not reproduced exactly here (supported: Idefics3Processor, Qwen2VLProcessor)",
        field="image_url",
    )
