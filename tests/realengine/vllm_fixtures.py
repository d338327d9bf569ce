"""The session fixtures every suite that drives a real vLLM shares: the engine environment, the
tiny model and the pool of running servers.

They are registered by the suite's root ``conftest.py`` (not ``tests/realengine``'s), so that a
suite outside this folder, such as the Engine conformance suite (``tests/engine``), runs its
vLLM case on the same servers instead of starting its own. Everything is built at test time and
offline (package installs aside): the environment once per machine (see ``vllm_env``), the tiny
random-weight Llama and its LoRA adapter once per session, vLLM servers on demand. Without the
on-disk torch wheel or a package registry the environment cannot be built and the tests that
ask for it skip with pip's reason.
"""

from __future__ import annotations

import atexit
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cached_venv import VenvUnavailable
from vllm_env import vllm_python as build_vllm_python
from vllm_server import TinyModel, VllmServerPool

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
    """A tiny random Llama with the embedded SmolLM2 tokenizer files, a LoRA adapter, and a tiny
    hybrid Gemma 3 (sliding window and full attention) with the same tokenizer files."""
    base = tmp_path_factory.mktemp("tiny-llama")
    folder, lora, hybrid = base / "model", base / "lora", base / "hybrid"
    args = [str(EMBEDDED_TOKENIZER), str(folder), str(lora), str(hybrid)]
    done = subprocess.run(
        [str(vllm_python), str(BUILDER), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, f"building the tiny model failed: {done.stderr[-3000:]}"
    return TinyModel(folder, lora, hybrid)


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
