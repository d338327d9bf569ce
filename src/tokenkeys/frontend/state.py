"""What every route of one app shares: the served models, the settings, the metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request

from tokenkeys.engine.protocol import Engine
from tokenkeys.errors import NotFound, Unsupported
from tokenkeys.frontend.config import HttpConfig
from tokenkeys.frontend.metrics import HttpMetrics
from tokenkeys.keys import Adapter
from tokenkeys.process.encode_lanes import offload
from tokenkeys.serving.guards import Guards
from tokenkeys.serving.lifecycle import Lifecycle
from tokenkeys.serving.models import ModelRegistry, ServedModel

T = TypeVar("T")


@dataclass(frozen=True)
class AppState:
    """The shared state of one HTTP app (``app.state.tokenkeys``)."""

    models: ModelRegistry
    config: HttpConfig
    metrics: HttpMetrics
    lifecycle: Lifecycle
    #: What admits every request (authentication, draining, streams per client).
    guards: Guards


def state_of(request: Request) -> AppState:
    """The app state behind a request."""
    return request.app.state.tokenkeys


async def preprocess(
    state: AppState, body_size: int, fn: Callable[..., T], *args: Any, **kw: Any
) -> T:
    """Run a Preprocessor call inline for small bodies, on a worker thread for large ones.

    A megabyte of text on the loop would stall every other request; below ``inline_bytes`` the
    thread hop costs more than it saves (:func:`tokenkeys.process.encode_lanes.offload`).
    """
    return await offload(body_size, state.config.inline_bytes, fn, *args, **kw)


def engine_of(model: ServedModel) -> Engine:
    """The model's engine; 501 when this server generates nothing for the model."""
    if model.engine is None:
        raise Unsupported(
            f"model {model.name!r} has no engine attached on this server, so it only answers "
            "/tokenize and /detokenize; start it with an engine to generate",
            field="model",
        )
    return model.engine


def adapters_of(model: ServedModel) -> tuple[Adapter, ...]:
    """The LoRA adapters the model's engine serves (none without an engine)."""
    return model.engine.adapters if model.engine is not None else ()


def resolve_model(models: ModelRegistry, name: str | None) -> tuple[ServedModel, str | None]:
    """The served model a request names, and the LoRA adapter when the name is an adapter's.

    As in vLLM, an adapter's name is a model name: it is served by its base model's tokenizer
    and Preprocessor, and generation runs with the adapter (which enters the cache keys).
    """
    try:
        return models.get(name), None
    except NotFound:
        for model in models:
            if any(adapter.name == name for adapter in adapters_of(model)):
                return model, name
        raise


def engine_context(model: ServedModel) -> int | None:
    """The context length the model's engine states, or None (no engine, or it states none)."""
    return model.engine.max_model_len if model.engine is not None else None


def max_model_len_of(model: ServedModel) -> int:
    """The context length to report: the engine's, else the tokenizer's, else 0 (unknown)."""
    limit = engine_context(model)
    if limit is None:
        limit = model.tokenizer.specials.model_max_length
    return int(limit or 0)
