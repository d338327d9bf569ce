"""What a server needs of an engine beyond generation: the hosting interface every kind meets.

A server hosts an engine of any kind the same way: it builds it from :class:`EngineInputs`
(through the kind's factory, :mod:`tokenkeys.engine.registry`), starts it, asks it whether it
is up, describes it, and closes it. Where the engine's KV events and its ``Control`` answers
come from is the one thing kinds differ in, and each kind says which by the protocol it meets:

- :class:`StreamedEngine`: this process streams the engine's KV events (the simulated engine
  emits them, the vLLM sidecar relays vLLM's) and answers ``Control`` for it;
- :class:`ForwardedEngine`: the engine is an OpenEngine server of its own; its events and its
  ``Control`` answers are forwarded from it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tokenkeys.engine.protocol import Engine

if TYPE_CHECKING:
    from tokenkeys.engine.config import EngineConfig
    from tokenkeys.events.stream import EventStream
    from tokenkeys.keys import CacheKeySpec
    from tokenkeys.preprocess.preprocessor import Preprocessor
    from tokenkeys.tokenizer import Tokenizer


#: Where an engine starting in this context says what it waits for (the server's readiness
#: reason while it starts: ``/health`` and gRPC ``Health`` report it); set by the runtime.
start_progress: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "tokenkeys_start_progress", default=None
)


def report_start(reason: str) -> None:
    """Say why the engine starting in this context does not serve yet (see start_progress)."""
    report = start_progress.get()
    if report is not None:
        report(reason)


@dataclass(frozen=True)
class EngineInputs:
    """What one served model's engine is built from (never the served model itself).

    ``stream`` is the model's KV-event stream (None for a kind whose events are forwarded);
    ``metrics`` what the kind's ``EngineKind.metrics`` made in the server's metrics registry;
    ``preprocessor`` the model's one Preprocessor (the vLLM sidecar renders its start probes
    with it).
    """

    name: str
    tokenizer: Tokenizer
    spec: CacheKeySpec
    config: EngineConfig
    stream: EventStream | None = None
    metrics: Any = None
    preprocessor: Preprocessor | None = None


class HostedEngine(Engine, Protocol):
    """An engine as a server hosts it: generation plus start, health and a description."""

    async def start(self) -> None:
        """Connect to what the engine needs; a conflict raises ConfigError (start refused)."""
        ...

    async def ensure_up(self) -> None:
        """Raise Unavailable when the engine cannot serve now (the server reports down)."""
        ...

    def describe(self) -> str:
        """One line for the server log: the kind and where it runs."""
        ...


class StreamedEngine(HostedEngine, Protocol):
    """An engine whose KV events this process streams; see the module doc."""

    @property
    def model_name(self) -> str:
        """The served model name the engine generates for."""
        ...

    @property
    def spec(self) -> CacheKeySpec:
        """The cache-key spec the engine's events follow."""
        ...

    @property
    def stream(self) -> EventStream:
        """The model's KV-event stream."""
        ...

    @property
    def block_size(self) -> int:
        """The engine's KV block size."""
        ...

    @property
    def num_blocks(self) -> int:
        """The engine's KV blocks."""
        ...

    @property
    def keys_verified(self) -> bool:
        """Whether every key the engine published so far is the one tokenkeys computes."""
        ...

    @property
    def takes_media(self) -> bool:
        """Whether :meth:`generate` keys a context's image items (gRPC ``Generate``'s media
        over token ids: ``ModelInfo.supports_multimodal``); False: it refuses them."""
        ...


class ForwardedEngine(HostedEngine, Protocol):
    """An OpenEngine engine whose events and ``Control`` answers are forwarded; see the doc."""

    @property
    def target(self) -> str:
        """The engine's ``host:port``."""
        ...

    @property
    def control(self) -> Any:
        """The engine's ``Control`` stub (``openengine_pb2_grpc.ControlStub``)."""
        ...
