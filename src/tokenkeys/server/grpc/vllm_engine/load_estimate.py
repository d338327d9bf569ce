"""What the face can tell about its engine's load from the requests it forwards.

smg's expected-wait score reads three ``SchedulerLoad`` fields that vLLM's own scheduler
stats do not carry and vLLM 0.32's ``--grpc`` server therefore estimates from the requests it
submits (smg-grpc-servicer 0.14.1, ``vllm/loads.py`` ``LoadTracker``): the uncached prompt
tokens still queued (``num_waiting_uncached_tokens``), the tokens streamed over the last
:data:`THROUGHPUT_WINDOW` seconds (``gen_throughput``, per second) and the prefix-cache hit
rate over the last :data:`HIT_RATE_SAMPLES` prompts (``cache_hit_rate``). The face keeps the
same figures with the same rules for its one rank, so smg scores a tokenkeys worker as it
scores vLLM's own. One difference by construction: vLLM's servicer counts a prompt's hit at
its first output, where vLLM reports the cached count; the Engine Protocol reports it with
the usage of the last step, so a prompt counts toward the hit rate once it finished.

One asyncio loop calls every method (no lock); every call is O(1) amortised but
:meth:`LoadEstimate.fields`, which walks the requests not started yet.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

#: Seconds of streamed tokens ``gen_throughput`` averages over (the servicer's window).
THROUGHPUT_WINDOW = 2.0
#: Prompts the hit rate is taken over (the servicer's sample count).
HIT_RATE_SAMPLES = 64


class LoadEstimate:
    """The three estimated ``SchedulerLoad`` fields of one rank; see the module doc."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: request id -> prompt tokens, of the requests without a first output, oldest first
        self._pending: OrderedDict[str, int] = OrderedDict()
        self._hits: deque[tuple[int, int]] = deque()
        self._prompt_sum = 0
        self._cached_sum = 0
        self._generated: deque[tuple[float, int]] = deque()
        self._generated_sum = 0

    def submitted(self, request_id: str, prompt_tokens: int) -> None:
        """A request of ``prompt_tokens`` went to the engine."""
        self._pending[request_id] = prompt_tokens

    def generated(self, request_id: str, tokens: int) -> None:
        """The engine streamed ``tokens`` for the request: it has started."""
        self._pending.pop(request_id, None)
        if tokens <= 0:
            return
        now = self._clock()
        self._generated.append((now, tokens))
        self._generated_sum += tokens
        self._trim(now)

    def counted(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A prompt's cached count, as the engine reported it."""
        if prompt_tokens <= 0:
            return
        self._hits.append((prompt_tokens, min(max(0, cached_tokens), prompt_tokens)))
        self._prompt_sum += prompt_tokens
        self._cached_sum += self._hits[-1][1]
        if len(self._hits) > HIT_RATE_SAMPLES:
            prompt, cached = self._hits.popleft()
            self._prompt_sum -= prompt
            self._cached_sum -= cached

    def finished(self, request_id: str) -> None:
        """The request ended (or was aborted or refused) whether or not it started."""
        self._pending.pop(request_id, None)

    def fields(self, waiting: int) -> dict[str, float | int]:
        """The ``SchedulerLoad`` fields now, given the engine's count of waiting requests: the
        youngest ``waiting`` requests not started are the queued ones (admission is FCFS, the
        older ones are in prefill), each prompt discounted by the recent hit rate."""
        self._trim(self._clock())
        rate = min(1.0, self._cached_sum / self._prompt_sum) if self._prompt_sum > 0 else 0.0
        prompts = list(self._pending.values())
        queued = sum(p * (1.0 - rate) for p in prompts[len(prompts) - min(waiting, len(prompts)) :])
        return {
            "num_waiting_uncached_tokens": round(queued),
            "gen_throughput": self._generated_sum / THROUGHPUT_WINDOW,
            "cache_hit_rate": rate,
        }

    def _trim(self, now: float) -> None:
        while self._generated and now - self._generated[0][0] > THROUGHPUT_WINDOW:
            self._generated_sum -= self._generated.popleft()[1]
