"""Where a Preprocessor call runs: inline when small, on the process's encode threads when large.

Encoding and template rendering are CPU work; on the event loop a megabyte prompt would hold up
every other request of the process (HTTP and gRPC share the loop). Large calls therefore run on
a pool of encode threads of their own. That helps only because the encode itself releases the
GIL (:class:`tokenkeys.tokenizer.backends.TokenizersBackend` uses the batch calls for that
reason); what stays under the GIL (building the id list, offsets) is short.

The pool is small on purpose: one thread per core left over after the event loop's, and at
least one (:func:`encode_threads_for`). More threads than cores only interleave encodes: each
finishes later, they queue for the GIL when they come back, and the order in which requests
finish stops being the order they came in. On 2 cores, 1k-token /tokenize at 16 connections,
one process: 1 thread gave a p99 of 20-30 ms where asyncio's default pool (6 threads) gave
60-70 ms, at the same or a higher rate (docs/benchmarks.md, bench_vs_vllm). ``serve --processes
N`` uses the other cores with processes, each with its own pool.

After a large call the C heap is trimmed: glibc keeps what the worker threads' arenas freed
(a 3 MB prompt left the process ~430 MB larger, for good) until ``malloc_trim`` hands it back.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

#: Calls on inputs this large (bytes or characters) trim the heap afterwards.
TRIM_AFTER = 1 << 20

#: Upper bound of the default pool: past it, threads mostly wait for the GIL.
MAX_DEFAULT_THREADS = 8
#: Upper bound of ``serve --encode-threads`` (a guard against a typo).
MAX_ENCODE_THREADS = 256

_threads = 0
#: The encode pools, by lane: False for large calls, True for huge ones (from TRIM_AFTER on).
_pools: dict[bool, ThreadPoolExecutor] = {}


def encode_threads_for(workers: int, cores: int | None = None) -> int:
    """The default encode threads of each of ``workers`` processes on ``cores`` cores.

    Each process's event loop keeps a core busy at load; the encode threads get the rest.
    """
    cores = cores or os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_THREADS, cores // max(1, workers) - 1))


def set_encode_threads(threads: int) -> None:
    """Size this process's encode pools; pools already running finish their calls and go."""
    global _threads
    if threads < 1:
        raise ValueError(f"encode threads must be at least 1, got {threads}")
    if threads != _threads:
        for pool in _pools.values():
            pool.shutdown(wait=False)
        _pools.clear()
    _threads = threads


def _pool(huge: bool) -> ThreadPoolExecutor:
    pool = _pools.get(huge)
    if pool is None:
        threads = _threads or encode_threads_for(1)
        name = "tokenkeys-encode-huge" if huge else "tokenkeys-encode"
        pool = _pools[huge] = ThreadPoolExecutor(threads, thread_name_prefix=name)
    return pool


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc.malloc_trim if libc is not None else None  # glibc only
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _load_trim()


def trim_heap() -> bool:
    """Give the C heap's free memory back to the system; False where libc cannot."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


def _run(fn: Callable[..., T], args: tuple[Any, ...], kw: dict[str, Any]) -> T:
    return fn(*args, **kw)


def _run_and_trim(fn: Callable[..., T], args: tuple[Any, ...], kw: dict[str, Any]) -> T:
    try:
        return fn(*args, **kw)
    finally:
        trim_heap()


async def offload(size: int, inline: int, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """``fn(*args, **kw)`` inline when ``size <= inline``, else on an encode thread.

    ``size`` measures the input (body bytes, text characters); from :data:`TRIM_AFTER` on, the
    heap is trimmed after the call, on the same thread. Calls wait for a free thread in the
    order they came; huge ones (from :data:`TRIM_AFTER` on) in a lane of their own, so that a
    prompt of several seconds holds up only the other huge ones.
    """
    if size <= inline:
        return fn(*args, **kw)
    huge = size >= TRIM_AFTER
    call = _run_and_trim if huge else _run
    return await asyncio.get_running_loop().run_in_executor(_pool(huge), call, fn, args, kw)
