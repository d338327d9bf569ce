"""The one interface every engine kind offers the serving layers: :class:`Engine`.

A served model generates through an :class:`Engine`: the simulated one of ``tokenkeys serve``
(:class:`~tokenkeys.server.runtime.local.LocalEngine`), an OpenEngine engine reached over gRPC
(:class:`~tokenkeys.client.engine.RemoteEngine`), the worker a router picks
(:class:`~tokenkeys.router.routed_engine.RoutedEngine`) or a real vLLM behind the sidecar
(:class:`~tokenkeys.server.runtime.vllm_sidecar.VllmSidecarEngine`). The gRPC ``Inference``
servicer and the HTTP routes call nothing else, so a new engine kind is one class that
satisfies this Protocol (and one entry in the conformance suite,
``tests/engine/test_engine_conformance.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # the simulated engine (engine.core) satisfies this Protocol and imports it
    from tokenkeys.engine.core import GenerateOutput, GenerationParams
    from tokenkeys.keys import Adapter, KeyContext


@dataclass(frozen=True)
class EngineLoad:
    """How busy an engine is: requests running and waiting, KV blocks used of the total.

    Block counts are 0 when the engine does not report them (a router's view of a pool).
    """

    running: int = 0
    waiting: int = 0
    used_kv_blocks: int = 0
    total_kv_blocks: int = 0


@runtime_checkable
class Engine(Protocol):
    """What the serving layers need of an engine; see the module doc."""

    def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: GenerationParams | None = None,
        context: KeyContext | None = None,
        *,
        request_id: str | None = None,
        lora_name: str | None = None,
        lora_id: int | None = None,
    ) -> AsyncIterator[GenerateOutput]:
        """One request: one output per generated token, usage and timing on the last."""
        ...

    @property
    def max_model_len(self) -> int | None:
        """The longest prompt plus output the engine accepts; None when it does not say."""
        ...

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """The LoRA adapters served, each under its own model name (as vLLM serves them)."""
        ...

    async def load(self) -> EngineLoad:
        """The engine's current load."""
        ...

    async def close(self) -> None:
        """Release what the engine owns (idempotent); generation is refused afterwards."""
        ...
