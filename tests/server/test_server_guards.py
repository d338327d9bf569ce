"""The call guards on their own: authentication, draining, streams per client, their order."""

from __future__ import annotations

import asyncio

import pytest

from tokenkeys.access import BearerTokens
from tokenkeys.errors import TooManyRequests, Unauthenticated, Unavailable, status_of
from tokenkeys.serving.guards import (
    AuthGuard,
    Call,
    DrainGuard,
    Guards,
    StreamLimitGuard,
    build_guards,
    client_of,
)
from tokenkeys.serving.lifecycle import Lifecycle

TOKEN = "t" * 20


def _call(**kw) -> Call:
    return Call(**{"route": "/x", "client": "10.0.0.1", "authorization": None, **kw})


def test_client_of_strips_ports_from_grpc_peers() -> None:
    assert client_of("ipv4:127.0.0.1:5000") == "127.0.0.1"
    assert client_of("ipv6:[::1]:5000") == "::1"
    assert client_of("ipv6:%5B::1%5D:5000") == "::1"
    assert client_of("unix:/tmp/sock") == "unix:/tmp/sock"


def test_auth_guard() -> None:
    guard = AuthGuard(BearerTokens([TOKEN], "test"))
    assert guard.admit(_call(authorization=f"Bearer {TOKEN}")) is None
    assert guard.admit(_call(health=True)) is None
    for value in (None, TOKEN, "Basic abc", f"Bearer {TOKEN}x"):
        with pytest.raises(Unauthenticated):
            guard.admit(_call(authorization=value))
    with pytest.raises(Unauthenticated):
        AuthGuard(BearerTokens([TOKEN], "test"), protect_health=True).admit(_call(health=True))
    assert status_of(Unauthenticated("x"))[:2][1] == 401


def test_drain_guard_counts_and_refuses() -> None:
    lifecycle = Lifecycle()
    guard = DrainGuard(lifecycle)
    release = guard.admit(_call())
    assert lifecycle.inflight == 1
    lifecycle.begin_drain()
    with pytest.raises(Unavailable, match="shutting down"):
        guard.admit(_call())
    assert guard.admit(_call(health=True)) is None
    release()
    assert lifecycle.inflight == 0
    assert asyncio.run(lifecycle.wait_idle(1.0)) == 0


def test_stream_limit_is_per_client_and_released() -> None:
    guard = StreamLimitGuard(2)
    first = guard.admit(_call(streaming=True))
    guard.admit(_call(streaming=True))
    assert guard.admit(_call()) is None  # no stream: not counted
    with pytest.raises(TooManyRequests, match="max_streams_per_client") as info:
        guard.admit(_call(streaming=True))
    assert status_of(info.value)[1] == 429
    assert guard.admit(_call(streaming=True, client="10.0.0.2")) is not None
    first()
    assert guard.open_streams("10.0.0.1") == 1
    assert guard.admit(_call(streaming=True)) is not None
    assert StreamLimitGuard(0).admit(_call(streaming=True)) is None  # 0: no limit


def test_a_refusal_releases_what_earlier_guards_took() -> None:
    lifecycle = Lifecycle()
    guards = Guards([DrainGuard(lifecycle), StreamLimitGuard(1)])
    release = guards.admit(_call(streaming=True))
    with pytest.raises(TooManyRequests):
        guards.admit(_call(streaming=True))
    assert lifecycle.inflight == 1
    release()
    assert lifecycle.inflight == 0


def test_authentication_comes_first() -> None:
    lifecycle = Lifecycle()
    lifecycle.begin_drain()
    guards = build_guards(lifecycle, 4, BearerTokens([TOKEN], "test"))
    with pytest.raises(Unauthenticated):
        guards.admit(_call())  # an unauthenticated caller learns nothing of the server state
    with pytest.raises(Unavailable):
        guards.admit(_call(authorization=f"Bearer {TOKEN}"))
