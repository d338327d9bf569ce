"""Turning ``--model`` arguments into a registry of served models, all or nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenkeys.limits import Limits
from tokenkeys.preprocess import Preprocessor
from tokenkeys.server.models import ModelRegistry, ServedModel
from tokenkeys.tokenizer import (
    DEFAULT_MODEL_NAME,
    Tokenizer,
    TokenizerOptions,
    default_tokenizer_path,
)


@dataclass(frozen=True)
class ModelSource:
    """A served name and the tokenizer folder it is loaded from."""

    name: str
    path: Path

    @classmethod
    def parse(cls, spec: str) -> ModelSource:
        """``DIR`` (served under the folder's name) or ``NAME=DIR``."""
        name, sep, path = spec.partition("=")
        if sep and name and "/" not in name:
            return cls(name, Path(path))
        return cls(Path(spec).resolve().name, Path(spec))

    @classmethod
    def default(cls) -> ModelSource:
        """The embedded SmolLM2-135M-Instruct tokenizer."""
        return cls(DEFAULT_MODEL_NAME, default_tokenizer_path())


def load_models(
    sources: list[ModelSource], options: TokenizerOptions, limits: Limits
) -> ModelRegistry:
    """Load every model or raise on the first that fails; nothing is served half-loaded."""
    registry = ModelRegistry()
    for source in sources or [ModelSource.default()]:
        tokenizer = Tokenizer.load(source.path, options)
        registry.add(ServedModel(source.name, tokenizer, Preprocessor(tokenizer, limits)))
    return registry
