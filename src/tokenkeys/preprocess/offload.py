"""Where a Preprocessor call runs: inline when small, on a worker thread when large.

Encoding and template rendering are CPU work; on the event loop a megabyte prompt would hold up
every other request of the process (HTTP and gRPC share the loop). Large calls therefore run on
the loop's default executor. That helps only because the encode itself releases the GIL
(:class:`tokenkeys.tokenizer.backends.TokenizersBackend` uses ``encode_batch`` for that
reason); what stays under the GIL (building the id list, offsets) is short and Python switches
threads every few milliseconds there.

After a large call the C heap is trimmed: glibc keeps what the worker threads' arenas freed
(a 3 MB prompt left the process ~430 MB larger, for good) until ``malloc_trim`` hands it back.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Calls on inputs this large (bytes or characters) trim the heap afterwards.
TRIM_AFTER = 1 << 20


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


def _run_and_trim(fn: Callable[..., T], args: tuple[Any, ...], kw: dict[str, Any]) -> T:
    try:
        return fn(*args, **kw)
    finally:
        trim_heap()


async def offload(size: int, inline: int, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """``fn(*args, **kw)`` inline when ``size <= inline``, else on a worker thread.

    ``size`` measures the input (body bytes, text characters); from :data:`TRIM_AFTER` on, the
    heap is trimmed after the call, on the same worker thread.
    """
    if size <= inline:
        return fn(*args, **kw)
    if size >= TRIM_AFTER:
        return await asyncio.to_thread(_run_and_trim, fn, args, kw)
    return await asyncio.to_thread(fn, *args, **kw)
