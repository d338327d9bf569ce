"""``tokenkeys serve`` starts with glibc's larger per-thread cache (tokenkeys.process.allocator):
the rule on environments, and a real serve process's own environment after its re-exec."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
from engine_stack import ServeProcess

from tokenkeys.process.allocator import TCACHE_COUNT, TCACHE_VALUE, tuned_environment

SETTING = f"{TCACHE_COUNT}={TCACHE_VALUE}"


def test_the_cache_setting_is_added_on_glibc() -> None:
    assert tuned_environment({"A": "1"}, "glibc") == {"A": "1", "GLIBC_TUNABLES": SETTING}


def test_other_tunables_are_kept() -> None:
    env = tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "glibc")
    assert env == {"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{SETTING}"}


@pytest.mark.parametrize(
    ("env", "libc"),
    [
        ({"GLIBC_TUNABLES": f"{TCACHE_COUNT}=7"}, "glibc"),  # the operator's own value
        ({"TOKENKEYS_MALLOC": "system"}, "glibc"),  # opted out
        ({}, ""),  # musl and others: no such tunable
    ],
)
def test_left_alone(env: dict[str, str], libc: str) -> None:
    assert tuned_environment(env, libc) is None


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc tunables only")
def test_serve_runs_with_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("TOKENKEYS_MALLOC", raising=False)
    with ServeProcess() as served:  # execve keeps the pid: this is the serving process
        assert _environ(served.proc.pid).get("GLIBC_TUNABLES") == SETTING


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc tunables only")
def test_serve_keeps_the_allocator_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setenv("TOKENKEYS_MALLOC", "system")
    with ServeProcess() as served:
        assert "GLIBC_TUNABLES" not in _environ(served.proc.pid)
