"""SGLang's router ``smg`` (PyPI ``smg==1.13.0``) in front of ``tokenkeys serve`` engines.

``smg launch --worker-urls http://...`` registers an OpenAI-compatible HTTP worker it does not
recognise as ``generic``: it probes ``/health``, ``/v1/models`` (``owned_by``), ``/version``
(vLLM) and ``/server_info`` / ``/get_server_info`` (SGLang); tokenkeys answers the first two, the
rest are 404 and smg registers the worker anyway (its log: "registering as `generic`
OpenAI-compatible"). So no extra endpoint is served for it. Requests go to smg's
``/v1/chat/completions``; the engines report ``prompt_tokens_details.cached_tokens`` in usage.

smg's ``cache_aware`` policy over HTTP workers keeps its own approximate radix tree of the
request text it sent each worker (no KV events from a generic worker); ``prefix_hash`` hashes
the first ``--prefix-token-count`` tokens (four times as many characters for untokenized
requests) onto a consistent-hash ring with a load bound. Both run with their defaults.

The environment is built once by ``tests/cached_venv.py`` (``TOKENKEYS_SMG`` names an ``smg``
executable instead); :func:`smg_executable` returns ``None`` with the reason when neither works.
Everything binds to loopback, including smg's Prometheus listener (default ``0.0.0.0:29000``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

SMG_VERSION = "1.13.0"
POLICIES = ("cache_aware", "prefix_hash")


def smg_executable() -> tuple[Path | None, str]:
    """The ``smg`` command and a note on where it came from, or ``None`` and why not."""
    given = os.environ.get("TOKENKEYS_SMG")
    if given:
        return Path(given), f"smg from TOKENKEYS_SMG={given}"
    try:
        from cached_venv import PipInstall, VenvRecipe, VenvUnavailable, ensure_venv
    except ImportError:  # bench/run.py puts tests/ on sys.path; a bare import may not
        return None, "tests/cached_venv.py is not importable (run through bench/run.py)"
    recipe = VenvRecipe("smg", steps=(PipInstall((f"smg=={SMG_VERSION}",)),))
    try:
        python = ensure_venv(recipe)
    except VenvUnavailable as exc:
        return None, f"smg=={SMG_VERSION} could not be installed: {exc}"
    return python.parent / "smg", f"smg=={SMG_VERSION} from PyPI"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def smg_router(executable: Path, policy: str, workers: list[str]) -> AsyncIterator[str]:
    """Run ``smg launch`` with ``policy`` over ``workers`` (HTTP base URLs); yields its base
    URL once it lists every worker as healthy, and stops it on exit."""
    port, metrics_port = _free_port(), _free_port()
    args = [
        str(executable), "launch", "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--policy", policy, "--worker-startup-timeout-secs", "60", "--log-level", "warn",
        "--worker-urls", *workers,
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            for _ in range(600):
                if proc.poll() is not None:
                    raise RuntimeError(f"smg exited: {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
                with contextlib.suppress(httpx.HTTPError):
                    listed = (await client.get(f"{base}/workers")).json()
                    if _healthy(listed) >= len(workers):
                        break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("smg did not register the workers within 60 s")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _healthy(listed: object) -> int:
    """How many workers smg's ``GET /workers`` lists as healthy."""
    entries = listed.get("workers", []) if isinstance(listed, dict) else listed
    return sum(1 for w in entries or () if isinstance(w, dict) and w.get("is_healthy") is True)


async def chat(
    client: httpx.AsyncClient, base: str, model: str, messages: list[dict], max_tokens: int
) -> tuple[int, int, str]:
    """One chat completion through smg: (prompt tokens, cached tokens, reply text)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    response = await client.post(f"{base}/v1/chat/completions", json=body)
    response.raise_for_status()
    out = response.json()
    usage = out["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return usage["prompt_tokens"], cached, out["choices"][0]["message"]["content"] or ""
