"""A router's view of a worker's load (``router.load_view``), on a hand-driven clock."""

from __future__ import annotations

import math

from tokenkeys.router.workers.load_view import LoadView


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_own_requests_count_at_once_and_stop_counting_when_they_finish():
    view = LoadView(clock=Clock())
    first = view.begin([1, 2, 3])
    second = view.begin([1, 2, 4, 5])  # shares blocks 1 and 2 with the first
    assert view.active_blocks == 5 + 2  # distinct full blocks, one partial block per request
    assert view.inflight_prefix([1, 2, 3, 9]) == 3
    assert view.inflight_prefix([9, 1]) == 0  # a prefix, from the prompt's first block
    view.end(first)
    assert view.active_blocks == 4 + 1 and view.inflight_prefix([1, 2, 3]) == 2
    view.end(second)
    assert (view.active_blocks, view.inflight, dict(view.inflight_keys)) == (0, 0, {})
    assert not view.prefilling_keys


def test_blocks_to_prefill_are_queued_until_the_first_output():
    """What a request computes there (not cached, not held by another request of ours) is
    queued prefill for the next prompt until its first output arrives, as Dynamo counts a
    request's prefill tokens until it is marked prefill-completed."""
    view = LoadView(clock=Clock())
    first = view.begin([1, 2, 3, 4], cached=1)  # block 1 cached there: 2, 3, 4 to compute
    assert first.fresh == (2, 3, 4)
    assert view.queued_prefill({7, 8}) == 3
    # A prompt sharing blocks 1-3 would need 2 and 3 itself anywhere: only 4 is queued for it.
    assert view.queued_prefill({1, 2, 3, 9}) == 1
    # A second request sharing the first's blocks computes only its own new ones.
    second = view.begin([1, 2, 3, 5, 6])
    assert second.fresh == (5, 6)
    assert view.queued_prefill({7}) == 5
    view.first_output(first)
    view.first_output(first)  # once is enough
    assert view.queued_prefill({7}) == 2
    assert view.active_blocks == 6 + 2  # still running: its blocks are in use
    view.end(second)  # ended without an output (failed): no longer queued either
    assert view.queued_prefill({7}) == 0
    view.end(first)
    assert (view.inflight, dict(view.inflight_keys), dict(view.prefilling_keys)) == (0, {}, {})


def test_a_poll_counts_other_clients_blocks_and_not_this_routers_twice():
    clock = Clock()
    view = LoadView(clock=clock)
    started = view.begin([1, 2, 3, 4])  # 5 blocks of ours
    view.polled(3.0, 0.5, 25, 50)  # the worker: 25 of its 50 blocks in use, 20 other clients'
    assert view.active_blocks == 25 and view.capacity == 50
    clock.now += 2.0
    view.end(started)  # ours took 2 s and is done: 20 blocks of others remain...
    assert view.request_seconds == 2.0
    # ...fading as the report ages, with the time constant of this router's requests there.
    assert math.isclose(view.active_blocks, 20 * math.exp(-2.0 / 2.0))
    clock.now += 8.0
    assert math.isclose(view.active_blocks, 20 * math.exp(-10.0 / 2.0))
    view.polled(0.0, 0.0, 0)
    assert view.active_blocks == 0


def test_before_any_request_of_its_own_a_poll_is_taken_as_it_is():
    clock = Clock()
    view = LoadView(clock=clock)
    view.polled(2.0, 0.25, 12)
    clock.now += 60.0
    assert view.active_blocks == 12 and view.load == 2.0


def test_trust_flags_underreported_load_after_three_polls_and_clears_on_truth():
    from tokenkeys.router.workers.trust import DOUBT_POLLS, suspicions

    view = LoadView(wall=lambda: 100.0)
    view.begin([1, 2])
    view.begin([3])
    for _ in range(DOUBT_POLLS):
        assert not [s for s in suspicions(view, 100.0, 30.0, 100.0) if s.reason.startswith("load")]
        view.polled(0, 0.0, 0)  # claims idle with two requests of ours in flight
    (found,) = suspicions(view, 100.0, 30.0, 100.0)
    assert found.reason == "load_underreported" and "2 in flight" in found.message
    assert view.load == 2  # not believed
    view.polled(2, 0.0, 3)
    assert suspicions(view, 100.0, 30.0, 100.0) == []


def test_trust_flags_silence_only_after_requests_and_forgets_it_when_events_come():
    from tokenkeys.router.workers.trust import suspicions

    now = [100.0]
    view = LoadView(wall=lambda: now[0])
    assert suspicions(view, None, 30.0, 1000.0) == []  # no request sent: nothing to say
    started = view.begin([1])
    view.end(started)
    now[0] = 131.0
    (found,) = suspicions(view, 50.0, 30.0, now[0])
    assert found.reason == "events_silent" and "31.0 s ago" in found.message
    assert suspicions(view, 101.0, 30.0, now[0]) == []  # its batch came after the request
    view.begin([2])  # sent at 131, nothing applied since
    assert suspicions(view, 101.0, 30.0, 160.0) == []
    assert [s.reason for s in suspicions(view, 101.0, 30.0, 161.0)] == ["events_silent"]


def test_only_this_routers_own_requests_judge_a_workers_report():
    """Peer replicas' requests are counted for load, but a worker that reports fewer than
    those is not under-reporting: whether a peer's request reached it (or ended) is only as
    timely as the peer's entries."""
    view = LoadView(clock=Clock())
    view.adopt((1, 2), (2,))
    view.adopt((5,), (5,))
    for _ in range(5):
        view.polled(0, 0.0, 0)
    assert view.underreports == 0 and view.load == 2.0
    view.begin([7])
    view.polled(0, 0.0, 0)
    assert view.underreports == 1 and view.last_claim == (0, 1)
