"""The models a server serves, by name: each with its tokenizer, its one Preprocessor and the
parts that serve it (artifacts, cache keys, engine)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from tokenkeys.artifacts.streamer import ArtifactStreamer
from tokenkeys.engine.protocol import Engine
from tokenkeys.engine.tokenizer_only import TokenizerOnlyEngine
from tokenkeys.errors import ConfigError, FailedPrecondition, NotFound
from tokenkeys.keys import CacheKeySpec
from tokenkeys.keys.service import CacheKeyService
from tokenkeys.limits import Limits
from tokenkeys.preprocess import Preprocessor
from tokenkeys.tokenizer import Tokenizer


@dataclass(frozen=True)
class ServedModel:
    """One served model: its name, tokenizer and the Preprocessor every path shares.

    The optional parts say what the server offers for it: ``artifacts`` (GetTokenizerArtifacts),
    ``cache_keys`` (GetCacheKeySpec, ComputeCacheKeys; its spec is the one the engine keys its
    blocks with) and ``engine`` (generation). A part is added with :meth:`ModelRegistry.replace`
    and ``dataclasses.replace``; a model never changes under a caller that holds it.
    ``aliases`` are further names requests may use for it (vLLM's ``--served-model-name A B``:
    every name is served, answers carry the first, ``name``).
    """

    name: str
    tokenizer: Tokenizer
    preprocessor: Preprocessor
    artifacts: ArtifactStreamer | None = None
    cache_keys: CacheKeyService | None = None
    engine: Engine | None = None
    aliases: tuple[str, ...] = ()

    @property
    def chat_template(self) -> str | None:
        """The chat template a request without tools or its own template renders with."""
        return self.preprocessor.chat.served_template

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every name this model answers to, its own first."""
        return (self.name, *self.aliases)

    def check_fingerprint(self, expected: str | None, field_name: str) -> None:
        """FAILED_PRECONDITION carrying the current fingerprint when ``expected`` is stale."""
        if expected and expected != self.tokenizer.fingerprint:
            raise FailedPrecondition(
                f"{field_name} {expected!r} does not match the served tokenizer of model "
                f"{self.name!r}, whose fingerprint is now {self.tokenizer.fingerprint!r}: "
                "the tokenizer changed; pull the new revision (tokenkeys pull) and retry",
                field=field_name,
                fingerprint=self.tokenizer.fingerprint,
            )


class ModelRegistry:
    """Served models by name; the first one added is the default for requests naming none."""

    def __init__(self) -> None:
        self._models: dict[str, ServedModel] = {}
        self._by_alias: dict[str, ServedModel] = {}

    def add(self, model: ServedModel) -> None:
        """Register a model under each of its names; no name may be served twice."""
        for name in model.served_names:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"a served model name must be non-empty, got {name!r}")
            if name in self._models or name in self._by_alias:
                raise ConfigError(f"model name {name!r} is served twice", field="model")
        self._models[model.name] = model
        self._by_alias.update(dict.fromkeys(model.aliases, model))

    def replace(self, model: ServedModel) -> None:
        """Serve ``model`` in place of the registered model of the same name (same position)."""
        if model.name not in self._models:
            raise NotFound(f"model {model.name!r} is not served here", field="model")
        self._models[model.name] = model
        self._by_alias.update(dict.fromkeys(model.aliases, model))

    def rename(self, name: str, names: tuple[str, ...]) -> ServedModel:
        """Serve the model registered as ``name`` under ``names`` instead (the first is the
        name answers carry; same position); the renamed model."""
        old = self.get(name)
        if not names:
            raise ConfigError("a served model needs a name", field="model")
        renamed = dataclasses.replace(old, name=names[0], aliases=tuple(names[1:]))
        models = list(self._models.values())
        self._models.clear()
        self._by_alias.clear()
        try:
            for model in models:
                self.add(renamed if model is old else model)
        except ConfigError:
            self._models.clear()
            self._by_alias.clear()
            for model in models:
                self.add(model)
            raise
        return renamed

    def get(self, name: str | None) -> ServedModel:
        """The named model, or the default when ``name`` is empty; NotFound lists the names."""
        if not self._models:
            raise NotFound("this server serves no model", field="model")
        if not name:
            return next(iter(self._models.values()))
        found = self._models.get(name) or self._by_alias.get(name)
        if found is None:
            served = [n for m in self._models.values() for n in m.served_names]
            raise NotFound(
                f"model {name!r} is not served here; served models: {', '.join(served)}",
                field="model",
                served=served,
                name=name,
            )
        return found

    @property
    def names(self) -> list[str]:
        """The first name of each model (aliases are in ``ServedModel.aliases``)."""
        return list(self._models)

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(list(self._models.values()))


def attach_cache_keys(models: ModelRegistry, spec: CacheKeySpec | None, limits: Limits) -> None:
    """Give every served model a :class:`CacheKeyService` for ``spec`` (none when ``None``)."""
    if spec is None:
        return
    for model in models:
        service = CacheKeyService(spec, limits, tokenizer_fingerprint=model.tokenizer.fingerprint)
        models.replace(dataclasses.replace(model, cache_keys=service))


def attach_tokenizer_only(models: ModelRegistry, max_model_len: int | None) -> None:
    """Serve every model tokenizer-only (``serve --engine none``): an engine that refuses
    generation and states ``max_model_len`` as the context (None: the tokenizer's
    ``model_max_length``), :class:`~tokenkeys.engine.tokenizer_only.TokenizerOnlyEngine`."""
    for model in models:
        limit = max_model_len or model.tokenizer.specials.model_max_length
        engine = TokenizerOnlyEngine(model.name, limit)
        models.replace(dataclasses.replace(model, engine=engine))


def with_spec(model: ServedModel, spec: CacheKeySpec) -> ServedModel:
    """``model`` serving ``spec`` (its cache-key service rebuilt with the same limits); for a
    spec completed from the engine at start (the groups a vLLM keeps)."""
    service = model.cache_keys
    if service is None:
        return model
    rebuilt = CacheKeyService(
        spec, service.limits, tokenizer_fingerprint=service.tokenizer_fingerprint
    )
    return dataclasses.replace(model, cache_keys=rebuilt)
