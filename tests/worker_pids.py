"""Which process of ``serve|route --processes N`` answers: pids from output and /metrics."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import httpx

_PID = re.compile(r'tokenkeys_process\{pid="(\d+)"\}')


def announced_pids(lines: list[str]) -> set[int]:
    """The worker pids the supervisor announced."""
    for line in lines:
        match = re.match(r"workers: \d+ processes \(pids ([\d, ]+)\)", line)
        if match:
            return {int(p) for p in match.group(1).split(", ")}
    raise AssertionError(f"no workers line in {lines}")


def answering_pids(url: str, want: set[int], tries: int = 400) -> set[int]:
    """Pids seen on /metrics over fresh connections, until ``want`` are all seen."""
    seen: set[int] = set()
    for _ in range(tries):
        with httpx.Client(base_url=url, timeout=30) as client:
            seen |= {int(p) for p in _PID.findall(client.get("/metrics").text)}
        if want <= seen:
            break
    return seen


def until(condition: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    """Wait for ``condition`` (the limit only stops a broken build from hanging)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is gone too: its supervisor may not have reaped it yet.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
