"""Peers' released hashing code, each in its own cached virtualenv, driven over JSON lines.

A peer's pins are not the project's (SGLang pins torch, Dynamo ships a compiled router), so each
peer gets a virtualenv built once by ``tests/cached_venv.py`` into the environment cache
(``$TOKENKEYS_ENV_CACHE``, default ``~/.cache/tokenkeys/envs``) and reused by later runs. A
driver script (``drivers/``) runs in that environment, imports only the peer, and answers one
JSON request per line; the tests compute tokenkeys' side in the project's own Python. When an
environment cannot be built (no registry, no on-disk torch wheel, no compiler), the peer's tests
skip with the failing step and pip's own words.

Marker ``peers``: ``pytest -m peers`` runs just these, ``pytest -m "not peers"`` skips them.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from evidence import unavailable

from cached_venv import PipInstall, RunPython, VenvRecipe, VenvUnavailable, ensure_venv

DRIVERS = Path(__file__).parent / "drivers"

# Dynamo's Python API is the compiled kv-router in this one wheel (abi3, with its own deps).
DYNAMO = VenvRecipe("dynamo-1.6.1", steps=(PipInstall(("ai-dynamo-runtime==1.6.1",)),))

# SGLang's requirements pin torch 2.14.1 and CUDA kernels; its hashing needs neither. So: the CPU
# torch 2.13.0 (an on-disk wheel on these machines, needed by the torch extension loader that
# JIT-builds the C++ page hash), sglang itself without dependencies, then exactly what importing
# sglang.srt.mem_cache.{utils,events} and sglang.srt.disaggregation.kv_events pulls in (found by
# importing them in a bare environment until nothing was missing), torch named again so the
# resolver keeps 2.13.0. The last step builds the page-hash extension into the environment
# (g++ and OpenSSL headers: Debian's g++ and libssl-dev) so no test run compiles it.
SGLANG_IMPORT_DEPS = (
    "aiohttp==3.14.5",
    "ipython==9.18.1",
    "msgspec==0.23.0",
    "numpy==2.4.6",
    "orjson==3.13.0",
    "packaging==26.4",
    "pillow==13.0.0",
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "pyzmq==27.3.0",
    "requests==2.34.2",
    "starlette==1.10.0",
    "tqdm==4.70.1",
    "triton==3.9.0",
)
SGLANG = VenvRecipe(
    "sglang-0.5.23",
    steps=(
        PipInstall(("torch==2.13.0", "ninja==1.13.2")),
        PipInstall(("--no-deps", "sglang==0.5.23")),
        PipInstall(("torch==2.13.0", *SGLANG_IMPORT_DEPS)),
        RunPython(
            "build SGLang's native page hash",
            "import os, sys\n"
            "os.environ['TORCH_EXTENSIONS_DIR'] = os.path.join(sys.prefix, 'torch-extensions')\n"
            "from sglang.srt.mem_cache.utils import get_hash_str\n"
            "assert get_hash_str([1, 2], None, page_size=2) == [\n"
            "    '34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f']\n",
        ),
    ),
)

# The relay vLLM 0.32's --grpc server streams its KV events through (smg_grpc_servicer.kv_relay)
# and what it imports: the proto package, msgspec, grpcio, pyzmq (its ``vllm`` extra's, for the
# relay's own ZMQ streaming); the gRPC helpers the servicer package requires (1.85.1: the newest
# on PyPI).
SMG_RELAY = VenvRecipe(
    "smg-grpc-servicer-0.14.1",
    steps=(
        PipInstall(
            (
                "smg-grpc-servicer==0.14.1",
                "smg-grpc-proto==0.4.28",
                "msgspec==0.23.0",
                "pyzmq==27.3.0",
                "grpcio==1.85.3",
                "grpcio-reflection==1.85.1",
                "grpcio-health-checking==1.85.1",
            )
        ),
    ),
)

# A guard against a wedged driver, not a measurement: answers take milliseconds.
ANSWER_TIMEOUT_S = 300.0


class PeerDriver:
    """One driver process in a peer's virtualenv; :meth:`call` sends a request, returns the
    result, and raises with the driver's traceback if the peer failed."""

    def __init__(self, python: Path, script: str):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not the project's src
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen(
            [str(python), str(DRIVERS / script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._process.stdout, selectors.EVENT_READ)

    def call(self, op: str, **fields: Any) -> Any:
        self._process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self._process.stdin.flush()
        if not self._selector.select(ANSWER_TIMEOUT_S):
            raise RuntimeError(f"peer driver gave no answer to {op!r}: {self._stderr_tail()}")
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"peer driver exited on {op!r}: {self._stderr_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"peer failed on {op!r}:\n{answer['error']}")
        return answer["result"]

    def close(self) -> None:
        self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._selector.close()
        self._stderr.close()

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:]


def _driver(recipe: VenvRecipe, script: str, package_version: str) -> Iterator[PeerDriver]:
    try:
        python = ensure_venv(recipe)
    except VenvUnavailable as exc:
        unavailable(f"{recipe.name}: {exc}")
    driver = PeerDriver(python, script)
    try:
        # The environment is the release the profile names, or the comparison means nothing.
        assert driver.call("version") == package_version
        yield driver
    finally:
        driver.close()


@pytest.fixture(scope="session")
def dynamo_peer() -> Iterator[PeerDriver]:
    """``dynamo._core`` of ai-dynamo-runtime 1.6.1, in its own virtualenv."""
    yield from _driver(DYNAMO, "dynamo_driver.py", "1.6.1")


@pytest.fixture
def dynamo_router_peer() -> Iterator[PeerDriver]:
    """Dynamo 1.6.1's ``KvRouter`` with one Dynamo worker per engine (``start`` them), fresh
    for each test: its workers and router live as long as the test's engines."""
    yield from _driver(DYNAMO, "dynamo_router_driver.py", "1.6.1")


@pytest.fixture(scope="session")
def smg_relay_peer() -> Iterator[PeerDriver]:
    """smg-grpc-servicer 0.14.1's KV-event relay normalization, in its own virtualenv."""
    yield from _driver(SMG_RELAY, "smg_relay_driver.py", "0.14.1")


@pytest.fixture
def smg_kv_relay_peer() -> Iterator[PeerDriver]:
    """smg-grpc-servicer 0.14.1's streaming relay with its vLLM hash check, as gRPC servers
    (``serve`` one per publisher), fresh for each test."""
    yield from _driver(SMG_RELAY, "smg_kv_relay_driver.py", "0.14.1")


@pytest.fixture(scope="session")
def sglang_peer() -> Iterator[PeerDriver]:
    """SGLang 0.5.23's page hashing and KV-event recorder, in its own virtualenv."""
    yield from _driver(SGLANG, "sglang_driver.py", "0.5.23")


@pytest.fixture(scope="session")
def dynamo_python() -> Path:
    """The Python of ai-dynamo-runtime 1.6.1's virtualenv (its ``dynamo.indexer`` and
    ``KvRouter``)."""
    try:
        return ensure_venv(DYNAMO)
    except VenvUnavailable as exc:
        unavailable(f"{DYNAMO.name}: {exc}")
