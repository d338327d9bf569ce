"""The simulated engine's latency model: prefill cost per uncached token, decode cost per token.

A prefix-cache hit removes prompt tokens from prefill, so it shortens time to first token, which
is what routers that score by cached prefix are meant to win.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenkeys.errors import ConfigError


@dataclass(frozen=True)
class LatencyModel:
    """Seconds per step of a simulated request; ``sleep`` makes the engine really wait them.

    ``time to first token = overhead_s + uncached_prompt_tokens * prefill_s_per_token``; each
    further output token costs ``decode_s_per_token``.
    """

    prefill_s_per_token: float = 0.0002
    decode_s_per_token: float = 0.005
    overhead_s: float = 0.001
    sleep: bool = False

    def __post_init__(self) -> None:
        for name in ("prefill_s_per_token", "decode_s_per_token", "overhead_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ConfigError(f"latency {name} must be >= 0 seconds, got {value!r}", field=name)

    def time_to_first_token(self, uncached_prompt_tokens: int) -> float:
        """Simulated seconds from admission to the first output token."""
        return self.overhead_s + uncached_prompt_tokens * self.prefill_s_per_token

    def inter_token(self) -> float:
        """Simulated seconds between two output tokens."""
        return self.decode_s_per_token
