"""What one generation request consumed: token counts and its simulated timing."""

from __future__ import annotations

from dataclasses import dataclass


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
