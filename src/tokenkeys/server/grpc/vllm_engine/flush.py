"""smg's ``FlushCache`` on an engine that can reset its prefix cache.

Semantics matched to smg-grpc-servicer 0.14.1's own vLLM servicer (``smg_grpc_servicer/vllm/
admin.py``, ``flush_cache``) and smg-grpc-proto 0.4.28 (``common.proto``, ``FlushCacheRequest``):
``timeout_s`` 0 makes one attempt, a refusal (blocks still held by running requests) answering
``success: false``; a positive ``timeout_s`` retries until the engine accepts or the time is
spent (then DEADLINE_EXCEEDED); a negative or non-finite one is INVALID_ARGUMENT. Only the
engine's local prefix cache is reset, never a connector's. The engine's event stream carries
the ``AllBlocksCleared`` of a reset that was done, so every consumer of its events sees it.
"""

from __future__ import annotations

import asyncio
import math

from tokenkeys.engine.protocol import PrefixCacheReset
from tokenkeys.errors import DeadlineExceeded, InvalidArgument
from tokenkeys.server.grpc.vllm_engine.stubs import common_pb2

#: Seconds between attempts while requests still hold blocks.
RETRY_INTERVAL_S = 0.05

DONE = "Local KV prefix cache flushed successfully"
REFUSED = "KV prefix cache reset refused; requests may be in flight"


async def flush_cache(
    engine: PrefixCacheReset, timeout_s: float, rpc_remaining: float | None
) -> common_pb2.FlushCacheResponse:
    """Reset ``engine``'s prefix cache within ``timeout_s`` (see the module doc); the call's
    own deadline (``rpc_remaining``) bounds the wait too."""
    if not math.isfinite(timeout_s) or timeout_s < 0:
        raise InvalidArgument(
            f"timeout_s must be finite and at least 0, got {timeout_s}", field="timeout_s"
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    if rpc_remaining is not None:
        deadline = min(deadline, loop.time() + rpc_remaining)
    while True:
        if await engine.reset_prefix_cache():
            return common_pb2.FlushCacheResponse(success=True, message=DONE)
        if timeout_s == 0:
            return common_pb2.FlushCacheResponse(success=False, message=REFUSED)
        left = deadline - loop.time()
        if left <= 0:
            raise DeadlineExceeded(
                f"FlushCache: the engine still refused the reset after timeout_s {timeout_s} "
                "(requests hold blocks); retry with a longer timeout_s",
                field="timeout_s",
            )
        await asyncio.sleep(min(RETRY_INTERVAL_S, left))
