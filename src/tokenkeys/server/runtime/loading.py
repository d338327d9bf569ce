"""Turning ``--model`` arguments into a registry of served models, all or nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenkeys.artifacts.manifest import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE
from tokenkeys.artifacts.streamer import ArtifactStreamer
from tokenkeys.limits import Limits
from tokenkeys.preprocess import Preprocessor
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.preprocess.images import ImageOptions
from tokenkeys.preprocess.incremental import IncrementalOptions
from tokenkeys.serving.models import ModelRegistry, ServedModel
from tokenkeys.tokenizer import (
    DEFAULT_MODEL_NAME,
    Tokenizer,
    TokenizerOptions,
    default_tokenizer_path,
)
from tokenkeys.tokenizer.proto import tokenizer_identity


@dataclass(frozen=True)
class ModelSource:
    """A served name (and further names) and the tokenizer folder it is loaded from.

    ``given_name``: the name was given (``NAME=DIR``, ``--served-model-name``), not taken from the
    folder or the default; a vLLM sidecar serves an unnamed model under vLLM's names."""

    name: str
    path: Path
    aliases: tuple[str, ...] = ()
    given_name: bool = False

    @classmethod
    def parse(cls, spec: str) -> ModelSource:
        """``DIR`` (served under the folder's name) or ``NAME=DIR``.

        NAME may be a Hugging Face id (``org/name``), as vLLM serves them. A spec that is an
        existing folder is always a DIR, so a folder whose path holds ``=`` needs no quoting.
        """
        name, sep, path = spec.partition("=")
        if sep and name and not Path(spec).is_dir():
            return cls(name, Path(path), given_name=True)
        return cls(Path(spec).resolve().name, Path(spec))

    def named(self, names: list[str]) -> ModelSource:
        """This folder served under ``names`` (vLLM's ``--served-model-name``): the first is
        the name answers carry, every one is accepted; no names keeps this source's."""
        if not names:
            return self
        return dataclasses.replace(self, name=names[0], aliases=tuple(names[1:]), given_name=True)

    @classmethod
    def default(cls) -> ModelSource:
        """The embedded SmolLM2-135M-Instruct tokenizer."""
        return cls(DEFAULT_MODEL_NAME, default_tokenizer_path())


def chat_config_digest(chat: ChatOptions) -> str | None:
    """SHA-256 of the server-side chat settings that change rendered prompts, or None.

    A ``--chat-template`` override, default template kwargs, the content format and the
    tool_choice=none rule all change the tokens a chat request produces, so they enter the
    tokenizer fingerprint (as ``TokenizerOptions.chat_template_sha256``).
    """
    # Render limits refuse renders but never change one: they stay out of the identity.
    if dataclasses.replace(chat, limits=ChatOptions().limits) == ChatOptions():
        return None
    doc = {
        "chat_template": chat.chat_template,
        "default_chat_template_kwargs": _plain(chat.default_chat_template_kwargs),
        "content_format": chat.content_format,
        "exclude_tools_when_tool_choice_none": chat.exclude_tools_when_tool_choice_none,
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def load_models(
    sources: list[ModelSource],
    options: TokenizerOptions,
    limits: Limits,
    chat: ChatOptions | None = None,
    *,
    artifact_chunk_size: int | None = None,
    incremental: IncrementalOptions | None = None,
    images: ImageOptions | None = None,
) -> ModelRegistry:
    """Load every model or raise on the first that fails; nothing is served half-loaded.

    Each model's Preprocessor keeps its own incremental tokenization cache (``incremental``:
    its budget and guard rate; None: the defaults).

    Every model serves its files (GetTokenizerArtifacts) in chunks of ``artifact_chunk_size``
    bytes by default (None: 512 KiB, or less when messages are capped lower); a request may ask
    for any size up to what one gRPC message may carry.
    """
    chat = chat or ChatOptions()
    options = dataclasses.replace(options, chat_template_sha256=chat_config_digest(chat))
    registry = ModelRegistry()
    # The server sends messages up to a multiple of max_request_bytes (server/grpc/server.py), so a
    # chunk no larger than max_request_bytes always fits, whatever the configured limit.
    max_chunk = min(MAX_CHUNK_SIZE, max(MIN_CHUNK_SIZE, limits.max_request_bytes))
    chunk = (
        min(DEFAULT_CHUNK_SIZE, max_chunk) if artifact_chunk_size is None else artifact_chunk_size
    )
    for source in sources or [ModelSource.default()]:
        tokenizer = Tokenizer.load(source.path, options)
        # The token floor is derived from tokenizer.json once (44 ms for the 49k-token default);
        # derived here, the server's first request does not pay for it.
        _ = tokenizer.token_floor
        artifacts = ArtifactStreamer(
            tokenizer,
            tokenizer_identity(tokenizer),
            default_chunk_size=chunk,
            max_chunk_size=max_chunk,
        )
        preprocessor = Preprocessor(
            tokenizer,
            limits,
            chat,
            incremental or IncrementalOptions(),
            model=source.name,
            images=images or ImageOptions(),
        )
        registry.add(
            ServedModel(
                source.name, tokenizer, preprocessor, artifacts=artifacts, aliases=source.aliases
            )
        )
    return registry
