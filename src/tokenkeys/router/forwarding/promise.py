"""The promise against the answer: the cached tokens the router expected, and those served.

When the router picks a worker because it holds a prompt's prefix, it promises a cache hit;
the engine's answer says what it actually reused (``usage.prompt_tokens_details.cached_tokens``,
vLLM's field, also the simulated engine's). :class:`Promise` keeps both for one request, as
one small frozen value, so the metrics, the response headers and whatever explains a miss read
the same numbers.

Expected tokens follow the engine's own rule: a prompt's matched full blocks, but never its
last token, which the engine always computes (vLLM 0.32 ``max_cache_hit_length = num_tokens -
1`` in ``vllm/v1/core/kv_cache_manager.py``, whole blocks below it); a completions batch sums
its prompts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram

from tokenkeys.serving.labelled import Children

#: Response headers of a forwarded request (``docs/router.md``).
HEADER_EXPECTED = "x-tokenkeys-expected-cached-tokens"
HEADER_SERVED = "x-tokenkeys-served-cached-tokens"
_EXPECTED, _SERVED = HEADER_EXPECTED.encode(), HEADER_SERVED.encode()

_DIFFERENCE_BUCKETS = (-4096, -1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024, 4096)


def expected_tokens(matched_blocks: int, prompt_len: int, block_size: int) -> int:
    """Tokens a prompt of ``prompt_len`` reuses from ``matched_blocks`` cached full blocks."""
    if prompt_len <= 0 or block_size <= 0:
        return 0
    return min(matched_blocks, (prompt_len - 1) // block_size) * block_size


@dataclass(frozen=True)
class Promise:
    """What the router expected ``worker`` to serve from cache, and what it reported.

    ``matched_blocks`` per prompt (what the index matched at ``worker``); ``served_tokens`` is
    None until an answer reports ``cached_tokens`` (an error, or an engine that does not say).
    """

    worker: str
    model: str
    block_size: int
    prompt_tokens: tuple[int, ...]
    matched_blocks: tuple[int, ...]
    served_tokens: int | None = None

    @cached_property
    def expected_tokens(self) -> int:
        """Cached prompt tokens the router expects the worker to report (read by the metrics,
        the headers and the explanations of one answer: summed once)."""
        return sum(
            expected_tokens(m, n, self.block_size)
            for m, n in zip(self.matched_blocks, self.prompt_tokens, strict=True)
        )

    @property
    def difference(self) -> int | None:
        """Served minus expected tokens (negative: an over-promise); None without an answer."""
        return None if self.served_tokens is None else self.served_tokens - self.expected_tokens

    @property
    def over_promised(self) -> bool:
        """The worker served fewer cached tokens than the router expected."""
        return self.served_tokens is not None and self.served_tokens < self.expected_tokens

    def answered(self, usage: Any) -> Promise:
        """This promise with the ``cached_tokens`` of an OpenAI ``usage`` object (unchanged
        when the usage carries none)."""
        served = cached_tokens(usage)
        if served is None:
            return self
        # Every field but the served tokens, as replace() copies them (without its walk over
        # the fields, once per answer).
        return Promise(
            self.worker,
            self.model,
            self.block_size,
            self.prompt_tokens,
            self.matched_blocks,
            served,
        )


def cached_tokens(usage: Any) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens``, or None when absent."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def promise_headers(promise: Promise) -> list[tuple[bytes, bytes]]:
    """The expected (and, once known, served) cached tokens as response headers."""
    headers = [(_EXPECTED, b"%d" % promise.expected_tokens)]
    if promise.served_tokens is not None:
        headers.append((_SERVED, b"%d" % promise.served_tokens))
    return headers


class PromiseMetrics:
    """Promises against answers, on the router's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.difference = Histogram(
            "tokenkeys_router_promise_difference_tokens",
            "Cached prompt tokens a worker served minus those the router expected, per "
            "forwarded request that reported cached_tokens (negative: an over-promise)",
            ["model"],
            buckets=_DIFFERENCE_BUCKETS,
            registry=registry,
        )
        self.over_promises = Counter(
            "tokenkeys_router_over_promises",
            "Forwarded requests whose worker served fewer cached tokens than the router expected",
            ["worker"],
            registry=registry,
        )
        self.unanswered = Counter(
            "tokenkeys_router_promises_unanswered",
            "Forwarded requests whose answer reported no cached_tokens (nothing to compare)",
            ["worker"],
            registry=registry,
        )
        self._difference_of = Children(self.difference)
        self._over_promises_of = Children(self.over_promises)
        self._unanswered_of = Children(self.unanswered)

    def record(self, promise: Promise) -> None:
        """Count one finished request's promise."""
        difference = promise.difference
        if difference is None:
            self._unanswered_of[(promise.worker,)].inc()
            return
        self._difference_of[(promise.model,)].observe(difference)
        if promise.over_promised:
            self._over_promises_of[(promise.worker,)].inc()


def matched_at(worker: str, decisions: Sequence[Any], body: Any = None) -> tuple[int, ...]:
    """Blocks each prompt's decision found cached at ``worker``, as the engine will read them.

    A request asking for ``prompt_logprobs`` reads nothing from the cache: vLLM computes the
    whole prompt for its logprobs (``SamplingParams.skip_reading_prefix_cache`` defaults to
    ``prompt_logprobs is not None``, vllm/sampling_params.py; ``Request.
    get_skip_reading_prefix_cache``, vllm/v1/request.py, 0.32), so the promise is 0 blocks.
    """
    if isinstance(body, dict) and body.get("prompt_logprobs") is not None:
        return tuple(0 for _ in decisions)
    return tuple(d.cached_blocks(worker) for d in decisions)


def answer_usage(body: bytes) -> Any:
    """The ``usage`` of a whole JSON answer, or None."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return doc.get("usage") if isinstance(doc, dict) else None


def event_usage(event: bytes) -> Any:
    """The ``usage`` of a server-sent event's JSON data, or None."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data.startswith(b"{"):
                with contextlib.suppress(orjson.JSONDecodeError):
                    chunk = orjson.loads(data)
                    return chunk.get("usage") if isinstance(chunk, dict) else None
    return None
