"""The VllmEngine face's load estimate: smg-grpc-servicer 0.14.1's ``LoadTracker`` rules
(``vllm/loads.py``) for one rank, on a clock the test moves."""

from __future__ import annotations

import pytest

from tokenkeys.server.grpc.vllm_engine.load_estimate import (
    HIT_RATE_SAMPLES,
    THROUGHPUT_WINDOW,
    LoadEstimate,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nothing_forwarded_reports_zeros():
    assert LoadEstimate(Clock()).fields(waiting=3) == {
        "num_waiting_uncached_tokens": 0,
        "gen_throughput": 0.0,
        "cache_hit_rate": 0.0,
    }


def test_throughput_counts_the_tokens_of_the_last_window():
    clock = Clock()
    estimate = LoadEstimate(clock)
    estimate.submitted("a", 10)
    estimate.generated("a", 3)
    clock.now += THROUGHPUT_WINDOW / 2
    estimate.generated("a", 5)
    assert estimate.fields(0)["gen_throughput"] == 8 / THROUGHPUT_WINDOW
    clock.now += THROUGHPUT_WINDOW * 0.75  # the first step is now out of the window
    assert estimate.fields(0)["gen_throughput"] == 5 / THROUGHPUT_WINDOW


def test_hit_rate_is_over_the_last_prompts():
    estimate = LoadEstimate(Clock())
    estimate.counted(100, 50)
    estimate.counted(100, 100)
    assert estimate.fields(0)["cache_hit_rate"] == pytest.approx(0.75)
    for _ in range(HIT_RATE_SAMPLES):
        estimate.counted(10, 0)
    assert estimate.fields(0)["cache_hit_rate"] == 0.0
    estimate.counted(10, 99)  # a count above the prompt is clamped to the prompt
    assert estimate.fields(0)["cache_hit_rate"] == pytest.approx(10 / (10 * HIT_RATE_SAMPLES))


def test_queued_work_is_the_youngest_waiting_prompts_discounted_by_the_hit_rate():
    estimate = LoadEstimate(Clock())
    estimate.counted(100, 50)  # hit rate 0.5
    for rid, prompt in (("old", 1000), ("mid", 200), ("new", 40)):
        estimate.submitted(rid, prompt)
    # Two waiting: the two youngest not started, the oldest is in prefill.
    assert estimate.fields(waiting=2)["num_waiting_uncached_tokens"] == round(0.5 * 240)
    estimate.generated("new", 1)  # started
    estimate.finished("mid")  # ended (refused, aborted) before starting
    assert estimate.fields(waiting=2)["num_waiting_uncached_tokens"] == 500
    assert estimate.fields(waiting=0)["num_waiting_uncached_tokens"] == 0
