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

import asyncio

from smg_gateway import SMG_VERSION, SmgRouter, chat, smg_executable, smg_router

POLICIES = ("cache_aware", "prefix_hash")

__all__ = ["POLICIES", "SMG_VERSION", "SmgRouter", "chat", "quiet", "smg_executable", "smg_router"]


async def quiet(router: SmgRouter, rounds: int = 5) -> None:
    """Until smg applied no new KV-event batch for ``rounds`` checks 20 ms apart: the gRPC
    rows' counterpart of the tokenkeys routers' settling on the engines' events."""
    last, still = await router.counter("smg_kv_event_batches_total", disposition="applied"), 0
    while still < rounds:
        await asyncio.sleep(0.02)
        now = await router.counter("smg_kv_event_batches_total", disposition="applied")
        still = still + 1 if now == last else 0
        last = now
