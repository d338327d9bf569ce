"""The session fixtures every suite that drives a real vLLM shares: the engine environment, the
tiny model and the pool of running servers, all from the run's :class:`vllm_schedule.Schedule`.

They are registered by the suite's root ``conftest.py`` (not ``tests/realengine``'s), so that a
suite outside this folder, such as the Engine conformance suite (``tests/engine``), runs its
vLLM case on the same servers instead of starting its own. Everything is built at test time and
offline (package installs aside): the environment once per machine (see ``vllm_env``), the tiny
random-weight Llama and its LoRA adapter once per run, vLLM servers as the plan needs them.
Without the on-disk torch wheel or a package registry the environment cannot be built: the tests
that ask for it skip with pip's reason, or fail with it under CI (``evidence``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from evidence import unavailable
from vllm_schedule import Schedule

from cached_venv import VenvUnavailable
from vllm_server import ForkServer, TinyModel, VllmServerPool

#: Where the root conftest keeps the run's schedule.
SCHEDULE = pytest.StashKey[Schedule]()


def _pool(request: pytest.FixtureRequest) -> VllmServerPool:
    try:
        return request.config.stash[SCHEDULE].pool()
    except VenvUnavailable as exc:
        unavailable(f"no vLLM engine environment: {exc}")


@pytest.fixture(scope="session")
def vllm_pool(request: pytest.FixtureRequest) -> VllmServerPool:
    """Running vLLM servers by configuration, as the run's plan needs them; stopped at the end
    (by the root conftest, which owns the schedule)."""
    return _pool(request)


# The environment and the model come with the pool, but through fixtures of their own: a test
# that starts no pool server (the render server, vLLM's gRPC launcher) does not take the pool.
@pytest.fixture(scope="session")
def vllm_python(request: pytest.FixtureRequest) -> Path:
    """The engine environment's Python."""
    return _pool(request).python


@pytest.fixture(scope="session")
def tiny_model(request: pytest.FixtureRequest) -> TinyModel:
    """A tiny random Llama with the embedded SmolLM2 tokenizer files, a LoRA adapter, and tiny
    hybrid Gemma 3 models (sliding window and full attention) with the same tokenizer files."""
    return _pool(request).model


@pytest.fixture(scope="session")
def vllm_fork_server(request: pytest.FixtureRequest) -> ForkServer | None:
    """The process that imported vLLM once and forks the pool's servers: a server started
    apart from the pool (``vllm launch render``) forks from it too (None: none runs)."""
    return _pool(request).fork_server()
