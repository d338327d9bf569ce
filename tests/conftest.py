"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tokenkeys.limits import Limits
from tokenkeys.serving.models import ModelRegistry

from support import ServerThread


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
