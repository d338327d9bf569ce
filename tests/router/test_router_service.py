"""Router configuration: every option checked before anything starts."""

from __future__ import annotations

import pytest

from tokenkeys.errors import ConfigError
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.policy.decision import RouteRequest
from tokenkeys.router.service import RoutingConfig
from tokenkeys.router.workers.discovery import check_address


@pytest.mark.parametrize("address", ["10.0.0.7:50051", "[::1]:50051", "engine-3.svc:9000"])
def test_worker_addresses(address):
    assert check_address(address) == address


@pytest.mark.parametrize("address", ["nohost", "host:", ":80", "host:0", "host:70000", "a b:1"])
def test_bad_worker_addresses(address):
    with pytest.raises(ConfigError, match="HOST:PORT"):
        check_address(address)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"workers": ()}, "at least one --worker"),
        ({"policy": "random"}, "--policy"),
        ({"index": "etcd"}, "--index"),
        ({"index": "redis"}, "--redis-url"),
        ({"transport": "nats"}, "--events"),
        ({"poll_interval": 0}, "--poll-interval"),
        ({"down_after": 0}, "--down-after"),
        ({"down_after": 1.5}, "--down-after"),
    ],
)
def test_bad_options_name_the_flag(options, message):
    with pytest.raises(ConfigError, match=message):
        RoutingConfig(**{"workers": ("127.0.0.1:1",), **options})


def test_the_memory_index_is_bounded_as_configured():
    index = RoutingConfig(workers=("127.0.0.1:1",), index_capacity=10).make_index()
    assert isinstance(index, MemoryPrefixIndex) and index.capacity == 10


class _LastWorker:
    """A policy of the caller's own: always the last ready worker by address."""

    name = "last_worker"

    def __init__(self) -> None:
        self.forgotten: list[str] = []

    async def choose(self, pool, request, load, *, record):  # noqa: ANN001, ANN201
        from tokenkeys.router import RouteDecision, WorkerScore

        ranking = [WorkerScore(w, 0.0, 0, load[w]) for w in sorted(load, reverse=True)]
        return RouteDecision.first_of(
            ranking, model=pool.name, policy=self.name, total_blocks=0, reason="last"
        )

    def forget(self, pool, address) -> None:  # noqa: ANN001
        self.forgotten.append(address)


async def test_a_policy_object_is_plugged_in(settings):
    from routing_support import start_cluster

    from tokenkeys.router import Policy

    policy = _LastWorker()
    assert isinstance(policy, Policy)
    cluster = await start_cluster(2, settings=settings, policy=policy)
    try:
        pool = cluster.router.pool(None)
        decision = await cluster.router.route(RouteRequest([1, 2, 3], pool.name))
        assert decision.policy == "last_worker"
        assert decision.worker == max(cluster.addresses)
    finally:
        await cluster.close()


def test_a_policy_that_is_neither_a_name_nor_an_object_is_refused():
    with pytest.raises(ConfigError, match="neither a policy name"):
        RoutingConfig(workers=("127.0.0.1:1",), policy=42)  # type: ignore[arg-type]
