"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tokenkeys.limits import Limits
from tokenkeys.serving.models import ModelRegistry

from support import ServerThread

# The real-vLLM session fixtures (environment, tiny model, server pool), here so that every
# suite shares one pool: tests/realengine and the Engine conformance suite's vLLM case.
from vllm_fixtures import tiny_model, vllm_pool, vllm_python  # noqa: F401


@pytest.fixture
def grpc_server() -> Iterator[Callable[..., ServerThread]]:
    """Factory: ``grpc_server(models, limits=None)`` starts a real server for one test."""
    started: list[ServerThread] = []

    def start(models: ModelRegistry, limits: Limits | None = None) -> ServerThread:
        server = ServerThread(models, limits).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)
