"""Fixtures of the real-engine tests: a vLLM and ``tokenkeys serve`` side by side.

The engine environment, the tiny model and the server pool are session fixtures of the whole
suite (``vllm_fixtures``, registered by ``tests/conftest.py``), shared with the Engine
conformance suite. Run or skip the tests that use them with ``-m realengine`` /
``-m "not realengine"``.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from served_pair import SERVE_ARGS, Pair, TokenkeysServe, running, sidecar_args
from vllm_server import DEFAULT_CONFIG, VllmServer, VllmServerPool


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


@pytest.fixture(scope="module")
def vllm(vllm_pool: VllmServerPool) -> VllmServer:
    """The default configuration's vLLM; a module serving another one overrides this."""
    return vllm_pool.get(DEFAULT_CONFIG)


@pytest.fixture(scope="module")
def sidecar(vllm: VllmServer) -> Iterator[TokenkeysServe]:
    """``tokenkeys serve`` in front of the module's ``vllm``, adopting what vLLM reports (no
    ``--kv-events-vllm-version``: the layout is that of the release ``/version`` names)."""
    process = TokenkeysServe(*sidecar_args(vllm))
    with running(process):
        yield process
