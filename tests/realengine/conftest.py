"""Fixtures of the real-engine tests: the engine environment, the tiny model, running servers.

Everything here is built at test time and offline (package installs aside): the engine
environment once per machine (see ``vllm_env``), the tiny random-weight Llama and its LoRA
adapter once per session, vLLM servers on demand through one pool. Without the on-disk torch
wheel or a package registry the environment cannot be built and these tests skip with pip's
reason. Run or skip just them with ``-m realengine`` / ``-m "not realengine"``.
"""

from __future__ import annotations

import atexit
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cached_venv import VenvUnavailable
from served_pair import SERVE_ARGS, Pair, TokenkeysServe
from vllm_env import vllm_python as build_vllm_python
from vllm_server import DEFAULT_CONFIG, TinyModel, VllmServerPool

EMBEDDED_TOKENIZER = (
    Path(__file__).resolve().parents[2] / "src" / "tokenkeys" / "data" / "smollm2-135m-instruct"
)
BUILDER = Path(__file__).resolve().parent / "build_tiny_model.py"


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The engine environment's Python; skips the test when the environment cannot be built."""
    try:
        return build_vllm_python()
    except VenvUnavailable as exc:
        pytest.skip(f"no vLLM engine environment: {exc}")


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A tiny random Llama with the embedded SmolLM2 tokenizer files, and a LoRA adapter."""
    base = tmp_path_factory.mktemp("tiny-llama")
    folder, lora = base / "model", base / "lora"
    done = subprocess.run(
        [str(vllm_python), str(BUILDER), str(EMBEDDED_TOKENIZER), str(folder), str(lora)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, f"building the tiny model failed: {done.stderr[-3000:]}"
    return TinyModel(folder, lora)


@pytest.fixture(scope="session")
def vllm_pool(
    vllm_python: Path, tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServerPool]:
    """Running vLLM servers by configuration, one at a time; all stopped at the end."""
    pool = VllmServerPool(vllm_python, tiny_model, tmp_path_factory.mktemp("vllm-logs"))
    atexit.register(pool.close)  # an interrupted session still stops its servers
    try:
        yield pool
    finally:
        pool.close()
        atexit.unregister(pool.close)


@pytest.fixture(scope="module")
def pair(vllm_pool: VllmServerPool) -> Iterator[Pair]:
    """vLLM (default configuration) and ``tokenkeys serve`` on the same folder, same name."""
    vllm = vllm_pool.get(DEFAULT_CONFIG)
    tokenkeys = TokenkeysServe(*SERVE_ARGS)
    try:
        tokenkeys.wait_healthy()
        with (
            httpx.Client(base_url=vllm.url, timeout=120) as engine,
            httpx.Client(base_url=tokenkeys.url, timeout=120) as ours,
        ):
            yield Pair(engine, ours)
    finally:
        tokenkeys.stop()
