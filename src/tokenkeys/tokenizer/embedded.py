"""The tokenizer shipped inside the package, served when no ``--model`` is given."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"


def default_tokenizer_path() -> Path:
    """Folder of the embedded SmolLM2-135M-Instruct tokenizer (Apache-2.0; see its NOTICE)."""
    return Path(str(resources.files("tokenkeys") / "data" / DEFAULT_MODEL_NAME))
