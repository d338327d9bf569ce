"""The one builder of ``tokenkeys route`` (:class:`RouterProcess`): order and all-or-nothing."""

from __future__ import annotations

import socket

import httpx
import pytest
from routing_support import start_cluster

from tokenkeys.errors import ConfigError
from tokenkeys.router.assembly import RouterProcess, RouterProcessConfig
from tokenkeys.router.service import RoutingConfig
from tokenkeys.router.workers.pool_setup import PoolSettings


async def test_workers_are_discovered_before_the_http_face_answers(settings) -> None:  # noqa: ANN001
    cluster = await start_cluster(1, settings=settings, http=True)
    try:
        # By the time HTTP listens, the pool exists: the first request is served, not 404.
        async with httpx.AsyncClient(base_url=cluster.url, timeout=30) as http:
            status = (await http.get("/router/workers")).json()
            assert [p["model"] for p in status["pools"]] == list(cluster.registry.pools)
            answer = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert answer.status_code == 200, answer.text
    finally:
        await cluster.close()


async def test_a_failed_step_leaves_nothing_running(tmp_path) -> None:
    config = RoutingConfig(workers=("127.0.0.1:1",), pools=PoolSettings(cache=tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        route = RouterProcessConfig(config, http_port=taken.getsockname()[1])
        server = RouterProcess(route)
        with pytest.raises(ConfigError, match="cannot bind HTTP"):
            await server.start()
    assert server.http is None
    assert server.service.registry.health._poller is None  # the polls were stopped
    assert server.lifecycle.state == "draining"
