"""Turning ``--model`` arguments into a registry of served models, all or nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenkeys.artifacts.manifest import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE
from tokenkeys.artifacts.streamer import ArtifactStreamer
from tokenkeys.limits import Limits
from tokenkeys.preprocess import Preprocessor
from tokenkeys.server.models import ModelRegistry, ServedModel
from tokenkeys.server.tokenizer_messages import tokenizer_identity
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
    sources: list[ModelSource],
    options: TokenizerOptions,
    limits: Limits,
    *,
    artifact_chunk_size: int | None = None,
) -> ModelRegistry:
    """Load every model or raise on the first that fails; nothing is served half-loaded.

    Every model serves its files (GetTokenizerArtifacts) in chunks of ``artifact_chunk_size``
    bytes by default (None: 512 KiB, or less when messages are capped lower); a request may ask
    for any size up to what one gRPC message may carry.
    """
    registry = ModelRegistry()
    # The server sends messages up to a multiple of max_request_bytes (grpc_server.py), so a
    # chunk no larger than max_request_bytes always fits, whatever the configured limit.
    max_chunk = min(MAX_CHUNK_SIZE, max(MIN_CHUNK_SIZE, limits.max_request_bytes))
    chunk = (
        min(DEFAULT_CHUNK_SIZE, max_chunk) if artifact_chunk_size is None else artifact_chunk_size
    )
    for source in sources or [ModelSource.default()]:
        tokenizer = Tokenizer.load(source.path, options)
        model = ServedModel(source.name, tokenizer, Preprocessor(tokenizer, limits))
        model.extensions["artifacts"] = ArtifactStreamer(
            tokenizer,
            tokenizer_identity(tokenizer),
            default_chunk_size=chunk,
            max_chunk_size=max_chunk,
        )
        registry.add(model)
    return registry
