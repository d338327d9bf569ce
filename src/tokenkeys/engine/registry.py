"""The registry of engine kinds: kind name -> the module that builds it, imported on first use.

As :mod:`tokenkeys.keys.registry` does for profiles: each kind's module holds one
:class:`EngineKind` named ``KIND``; a new kind is one module (or folder) and one line here.
An unknown kind raises :class:`~tokenkeys.errors.NotFound` naming every known one. A server
that serves tokenizers only has no engine configuration at all, hence no kind.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from tokenkeys.errors import NotFound

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from tokenkeys.engine.config import EngineConfig
    from tokenkeys.engine.hosting import EngineInputs, HostedEngine
    from tokenkeys.keys import CacheKeySpec

#: Kind name -> module holding its ``KIND``.
KINDS: dict[str, str] = {
    "simulated": "tokenkeys.engine.simulated.local",
    "remote": "tokenkeys.engine.remote",
    "vllm": "tokenkeys.engine.vllm.sidecar",
}


async def _as_given(config: EngineConfig) -> EngineConfig:
    return config


async def _spec_as_given(inputs: EngineInputs) -> CacheKeySpec:
    return inputs.spec


@dataclass(frozen=True)
class EngineKind:
    """How one kind of engine is built and hosted.

    - ``hosting``: ``"streamed"`` when this process streams the engine's KV events and answers
      its ``Control`` (:class:`~tokenkeys.engine.hosting.StreamedEngine`), ``"forwarded"``
      when both come from the engine's own OpenEngine server
      (:class:`~tokenkeys.engine.hosting.ForwardedEngine`);
    - ``build``: one served model's engine from its inputs (called in the serving loop);
    - ``prepare``: the configuration completed from the engine before any model's engine is
      built (the vLLM sidecar reads the event layout vLLM publishes); as given by default;
    - ``metrics``: the kind's own metrics, made once per server in the server's registry (the
      vLLM sidecar's live key check) and handed to every engine in ``EngineInputs.metrics``;
    - ``spec``: the spec one served model's engine keys with, completed from the engine before
      its stream is built (the vLLM sidecar learns vLLM's KV-cache groups); as given by default.
    """

    name: str
    hosting: Literal["streamed", "forwarded"]
    build: Callable[[EngineInputs], HostedEngine]
    prepare: Callable[[EngineConfig], Awaitable[EngineConfig]] = field(default=_as_given)
    metrics: Callable[[CollectorRegistry], Any] | None = None
    spec: Callable[[EngineInputs], Awaitable[CacheKeySpec]] = field(default=_spec_as_given)


@cache
def engine_kind(name: str) -> EngineKind:
    """The kind called ``name`` (a key of :data:`KINDS`)."""
    module = KINDS.get(name)
    if module is None:
        raise NotFound(
            f"unknown engine kind {name!r}; known kinds: {', '.join(sorted(KINDS))}",
            field="engine",
        )
    kind = importlib.import_module(module).KIND
    assert isinstance(kind, EngineKind) and kind.name == name, f"{module}.KIND is not {name!r}"
    return kind
