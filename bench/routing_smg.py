"""SGLang's router ``smg`` (PyPI ``smg==1.13.0``) in front of ``tokenkeys serve`` engines.

Over HTTP (``--worker-urls http://...``) smg registers an OpenAI-compatible worker it does not
recognise as ``generic``: it probes ``/health``, ``/v1/models`` (``owned_by``), ``/version``
(vLLM) and ``/server_info`` / ``/get_server_info`` (SGLang); tokenkeys answers the first two,
the rest are 404 and smg registers the worker anyway. Requests go to smg's
``/v1/chat/completions``; the engines report ``prompt_tokens_details.cached_tokens`` in usage.
smg's ``cache_aware`` policy over HTTP workers keeps its own approximate radix tree of the
request text it sent each worker (no KV events from a generic worker); ``prefix_hash`` hashes
the first ``--prefix-token-count`` tokens (four times as many characters for untokenized
requests) onto a consistent-hash ring with a load bound. Both run with their defaults.

Over gRPC (``--worker-urls grpc://...``, the engines serving ``--vllm-engine-face``) smg
tokenizes itself with the tokenizer it loads from the engines' ``GetTokenizer`` and its
``cache_aware`` policy indexes the engines' ``SubscribeKvEvents``.

The launcher is the tests' (``tests/smg_gateway.py``; bench/run.py puts tests/ on sys.path).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from smg_gateway import SMG_VERSION, chat, smg_executable
from smg_gateway import smg_router as _gateway

POLICIES = ("cache_aware", "prefix_hash")

__all__ = ["POLICIES", "SMG_VERSION", "chat", "smg_executable", "smg_router"]


@contextlib.asynccontextmanager
async def smg_router(executable: Path, policy: str, workers: list[str]) -> AsyncIterator[str]:
    """``smg launch`` with ``policy`` over ``workers``; yields its base URL once ready."""
    async with _gateway(executable, policy, workers) as router:
        yield router.base
