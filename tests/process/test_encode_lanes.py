"""Where Preprocessor calls run (tokenkeys.process.encode_lanes): small ones inline on the event
loop, large ones on the process's encode threads, in the order they came."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tokenkeys.process import encode_lanes as off


@pytest.mark.parametrize(
    ("workers", "cores", "threads"),
    [(1, 1, 1), (1, 2, 1), (2, 2, 1), (1, 4, 3), (2, 8, 3), (1, 64, 8), (16, 16, 1)],
)
def test_default_threads_leave_each_event_loop_a_core(workers: int, cores: int, threads: int):
    assert off.encode_threads_for(workers, cores) == threads


def test_small_calls_run_inline_large_ones_on_an_encode_thread() -> None:
    async def main() -> tuple[str, str]:
        small = await off.offload(10, 100, lambda: threading.current_thread().name)
        large = await off.offload(1000, 100, lambda: threading.current_thread().name)
        return small, large

    small, large = asyncio.run(main())
    assert small == threading.current_thread().name
    assert large.startswith("tokenkeys-encode")


def test_one_encode_thread_serves_calls_in_the_order_they_came() -> None:
    off.set_encode_threads(1)
    started: list[int] = []
    gate = threading.Event()

    def call(i: int) -> int:
        if i == 0:
            gate.wait(30)  # the others queue behind the first
        started.append(i)
        return i

    async def main() -> list[int]:
        tasks = [asyncio.ensure_future(off.offload(1000, 100, call, i)) for i in range(8)]
        await asyncio.sleep(0)  # every call submitted
        gate.set()
        return await asyncio.gather(*tasks)

    try:
        assert asyncio.run(main()) == list(range(8))
        assert started == list(range(8))
    finally:
        off.set_encode_threads(off.encode_threads_for(1))


def test_zero_threads_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        off.set_encode_threads(0)


def test_a_huge_call_does_not_hold_up_large_ones() -> None:
    off.set_encode_threads(1)
    release = threading.Event()

    def huge() -> str:
        # Released only once the large call has finished: in a shared lane it never is.
        return "huge" if release.wait(30) else "the large call waited behind the huge one"

    async def main() -> tuple[str, str]:
        slow = asyncio.ensure_future(off.offload(off.TRIM_AFTER, 100, huge))
        # Finishes while the huge call still occupies its (one-thread) lane.
        large = await off.offload(1000, 100, lambda: threading.current_thread().name)
        release.set()
        return large, await slow

    try:
        large, slow = asyncio.run(main())
        assert large.startswith("tokenkeys-encode_") and slow == "huge"
    finally:
        off.set_encode_threads(off.encode_threads_for(1))
