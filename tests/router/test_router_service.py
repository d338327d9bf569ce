"""Router configuration: every option checked before anything starts."""

from __future__ import annotations

import pytest

from tokenkeys.errors import ConfigError
from tokenkeys.router.index.memory import MemoryPrefixIndex
from tokenkeys.router.service import RouterConfig
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
        RouterConfig(**{"workers": ("127.0.0.1:1",), **options})


def test_the_memory_index_is_bounded_as_configured():
    index = RouterConfig(workers=("127.0.0.1:1",), index_capacity=10).make_index()
    assert isinstance(index, MemoryPrefixIndex) and index.capacity == 10
