"""What a server's engines are hosted with: the state the runtime owns and its hostings read.

:class:`~tokenkeys.server.runtime.engines.EngineRuntime` makes one :class:`RuntimeState` and
hands it to the hosting of its kind (``streamed``, ``forwarded``); the hostings and the
discovery answers they build read it, and only the runtime's lifecycle changes it. So the data
flows one way: runtime -> hosting -> discovery messages -> state, never back to the runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tokenkeys.engine.config import EngineConfig
from tokenkeys.engine.registry import EngineKind
from tokenkeys.errors import NotFound, Unavailable
from tokenkeys.keys import CacheKeySpec
from tokenkeys.serving.lifecycle import Lifecycle
from tokenkeys.serving.models import ModelRegistry, ServedModel

P = TypeVar("P")


@dataclass
class RuntimeState:
    """The served models, the engine configuration and kind, and where the lifecycle is."""

    models: ModelRegistry
    #: Completed by the kind's ``prepare`` when the runtime starts.
    config: EngineConfig
    kind: EngineKind
    #: The cache-key spec each served model's engine keys with.
    spec_of: Callable[[ServedModel], CacheKeySpec]
    #: The kind's own metrics (``EngineKind.metrics``), handed to every engine it builds.
    kind_metrics: Any = None
    #: The process's serving state: ``starting`` says why the engines do not serve yet.
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    #: The routable ``host:port`` of this server's gRPC endpoint, known after start.
    grpc_address: str | None = None
    #: Where this server's OpenAI HTTP frontend answers (``http://host:port``), once it
    #: listens; advertised in ``ServerInfo.http_frontend`` so routers forward requests to it.
    http_frontend: str = ""
    ready: bool = False
    draining: bool = False

    @property
    def instance_id(self) -> str:
        """This process's instance id."""
        return self.config.instance_id

    def serving(self, parts: Callable[[str], P], model: str) -> P:
        """``parts(model)`` while the engines serve: Unavailable while they start or stop,
        NotFound for a model without an engine (``parts`` raises KeyError)."""
        if not self.ready or self.draining:
            raise Unavailable(
                "the engine is " + ("stopping" if self.draining else "starting") + "; retry",
                field="model",
            )
        try:
            return parts(model)
        except KeyError:
            raise NotFound(f"model {model!r} has no engine here", field="model") from None
