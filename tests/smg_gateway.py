"""SGLang's gateway ``smg`` (PyPI ``smg==1.13.0``) run in front of engines, for tests and benches.

The environment is built once by :mod:`cached_venv` (``TOKENKEYS_SMG`` names an ``smg``
executable instead); :func:`smg_executable` returns ``None`` with the reason when neither works.
Everything binds to loopback, including smg's Prometheus listener (default ``0.0.0.0:29000``).

Workers are URLs: ``http://`` registers an OpenAI-compatible HTTP worker (smg probes it, finds
no vLLM or SGLang endpoint and registers it as ``generic``; its ``cache_aware`` policy then keeps
an approximate tree of the text it sent), ``grpc://`` a gRPC worker (smg detects the runtime from
the services it answers: tokenkeys' VllmEngine face registers as ``vllm``; smg then loads the
tokenizer from the worker's ``GetTokenizer`` when it cannot load the advertised path, sends token
ids and feeds the worker's ``SubscribeKvEvents`` into its event-driven index).
:func:`smg_router` returns once every worker is healthy and, for gRPC workers, once smg's
tokenizer for them is loaded. smg's log goes to a file (``SmgRouter.log``): a pipe nobody reads
would stall it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from cached_venv import PipInstall, VenvRecipe, VenvUnavailable, ensure_venv

SMG_VERSION = "1.13.0"
RECIPE = VenvRecipe("smg", steps=(PipInstall((f"smg=={SMG_VERSION}",)),))
# A guard against a wedged gateway, not a measurement.
START_LIMIT_S = 120.0


def smg_executable() -> tuple[Path | None, str]:
    """The ``smg`` command and a note on where it came from, or ``None`` and why not."""
    given = os.environ.get("TOKENKEYS_SMG")
    if given:
        return Path(given), f"smg from TOKENKEYS_SMG={given}"
    try:
        python = ensure_venv(RECIPE)
    except VenvUnavailable as exc:
        return None, f"smg=={SMG_VERSION} could not be installed: {exc}"
    return python.parent / "smg", f"smg=={SMG_VERSION} from PyPI"


@dataclass
class SmgRouter:
    """A running ``smg launch``: its base URL, its Prometheus URL and the file it logs to."""

    base: str
    metrics: str
    log: Path

    async def counter(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples carrying ``labels`` on smg's ``/metrics``."""
        async with httpx.AsyncClient(timeout=5) as client:
            text = (await client.get(self.metrics)).text
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    total += sample.value
        return total

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.asynccontextmanager
async def smg_router(
    executable: Path, policy: str, workers: list[str], *extra: str
) -> AsyncIterator[SmgRouter]:
    """Run ``smg launch --policy policy --worker-urls workers...`` until the block exits."""
    port, metrics_port = free_port(), free_port()
    args = [
        str(executable), "launch", "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--policy", policy, "--worker-startup-timeout-secs", "60", "--log-level", "warn",
        *extra, "--worker-urls", *workers,
    ]  # fmt: skip
    log = Path(tempfile.mkstemp(prefix="smg-", suffix=".log")[1])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # a tokenizer comes from a worker, never the hub
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    router = SmgRouter(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", log)
    grpc_models = bool([w for w in workers if w.startswith("grpc://")])
    try:
        await _until_ready(proc, router, len(workers), grpc_models)
        yield router
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _until_ready(
    proc: subprocess.Popen, router: SmgRouter, workers: int, tokenizer: bool
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_LIMIT_S
    async with httpx.AsyncClient(timeout=5) as client:
        while loop.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"smg exited: {router.log_tail()}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                listed = (await client.get(f"{router.base}/workers")).json()
                if _healthy(listed) >= workers and (
                    not tokenizer or await _tokenizer_loaded(client, router.base)
                ):
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"smg did not get ready within {START_LIMIT_S:.0f} s: {router.log_tail()}")


def _healthy(listed: object) -> int:
    """How many workers smg's ``GET /workers`` lists as healthy."""
    entries = listed.get("workers", []) if isinstance(listed, dict) else listed
    return sum(1 for w in entries or () if isinstance(w, dict) and w.get("is_healthy") is True)


async def _tokenizer_loaded(client: httpx.AsyncClient, base: str) -> bool:
    """Whether smg's tokenizer registry (``GET /v1/tokenizers``) holds one."""
    listed = (await client.get(f"{base}/v1/tokenizers")).json()
    entries = listed.get("tokenizers", []) if isinstance(listed, dict) else listed
    return bool(entries)


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
