"""The one interface every engine kind offers the serving layers: :class:`Engine`.

A served model generates through an :class:`Engine`: the simulated one of ``tokenkeys serve``
(:class:`~tokenkeys.engine.simulated.local.LocalEngine`), an OpenEngine engine reached over gRPC
(:class:`~tokenkeys.engine.remote.RemoteEngine`), the worker a router picks
(:class:`~tokenkeys.router.routed_engine.RoutedEngine`) or a real vLLM behind the sidecar
(:class:`~tokenkeys.engine.vllm.sidecar.VllmSidecarEngine`). The gRPC ``Inference``
servicer and the HTTP routes call nothing else, so a new engine kind is one class that
satisfies this Protocol (and one entry in the conformance suite,
``tests/engine/test_engine_conformance.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tokenkeys.keys import Adapter, KeyContext


@dataclass(frozen=True)
class Usage:
    """Token accounting of one request, as OpenAI ``usage`` reports it.

    ``cached_prompt_tokens`` is the part of the prompt served from the prefix cache
    (``usage.prompt_tokens_details.cached_tokens``); always a whole number of blocks.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class SimulatedTiming:
    """Latency the simulated engine attributes to a request (seconds, not wall time)."""

    ttft_s: float
    total_s: float


@dataclass(frozen=True)
class GenerationParams:
    """What a request asks of the engine's sampling and stopping, as every engine kind gets it.

    ``max_tokens`` None is the engine's default: the simulated engine's ``default_max_tokens``
    setting, the rest of the context for a real vLLM. The simulated engine honours
    ``max_tokens``, ``seed`` and ``stop_token_ids``; the distribution knobs (``temperature``
    .. ``repetition_penalty``, vLLM's ``SamplingParams`` names and meanings) shape nothing it
    draws and no count, and reach a real engine unchanged.
    """

    max_tokens: int | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None

    def sampling(self) -> dict[str, float | int]:
        """The distribution knobs that are set, by vLLM's names."""
        return {k: v for k, v in ((k, getattr(self, k)) for k in SAMPLING_KNOBS) if v is not None}


#: GenerationParams fields that only shape the sampling distribution (vLLM's names).
SAMPLING_KNOBS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


@dataclass(frozen=True)
class GenerateOutput:
    """One streamed step of a request: its new token, and on the last one usage and timing."""

    request_id: str
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None
    usage: Usage | None = None
    timing: SimulatedTiming | None = None


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


@runtime_checkable
class PrefixCacheReset(Protocol):
    """An engine whose prefix cache can be emptied on request (smg's ``FlushCache``).

    Not every kind can: a forwarded engine or a router's pool has no such call, so this is a
    capability of its own beside :class:`Engine` rather than a method every kind must fake.
    """

    async def reset_prefix_cache(self) -> bool:
        """Forget every cached block; True when done, False when the engine refuses now
        (blocks still held by running requests, as vLLM refuses). Consumers of the engine's
        KV events see ``AllBlocksCleared`` after a reset that was done."""
        ...
