"""Running out of descriptors: accept failures logged once per interval, and the server recovers."""

from __future__ import annotations

import http.client
import logging
import resource
import time

from served import Served

from tokenkeys.transport.accept_errors import ACCEPT_FAILED
from tokenkeys.transport.throttled_log import ThrottledLog

from dos_support import host_port, open_connections, wait_all_closed

#: The serve process's descriptor limit: enough to start, far below the connections opened.
_SERVER_DESCRIPTORS = 160
#: Connections of the flood beyond the server's limit (it also holds descriptors of its own).
_OVER = 40


def _low_descriptor_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (_SERVER_DESCRIPTORS, _SERVER_DESCRIPTORS))


def _health(address: tuple[str, int]) -> bool:
    try:
        conn = http.client.HTTPConnection(*address, timeout=5)
        conn.request("GET", "/health")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except (OSError, http.client.HTTPException):
        return False


def test_descriptor_exhaustion_logs_a_count_and_the_server_recovers() -> None:
    started = time.monotonic()
    with Served("--http-header-timeout", "11", preexec=_low_descriptor_limit) as served:
        address = host_port(served.http_address)
        # More connections than the server has descriptors: accept() fails with EMFILE for the
        # rest, again and again, for as long as they are held. Fewer than twice its descriptors:
        # the held ones are closed a header timeout later and the rest accepted then, so the
        # flood ends in two timeouts (twice its descriptors took three, 11 s of the suite).
        flood = open_connections(address, _SERVER_DESCRIPTORS + _OVER, sources=4, first=b"GET /")
        # The held ones are closed by the server after its header timeout (11 s here, so the
        # flood outlasts one 10 s log interval), which frees descriptors: the recovery is the
        # server's own.
        still_open = wait_all_closed(flood, timeout=40)
        for sock in flood:
            sock.close()
        deadline = time.monotonic() + 20
        while not _health(address) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _health(address), "the server did not recover"
        assert still_open == 0
    elapsed = time.monotonic() - started
    accept_lines = [line for line in served.errors if "cannot accept new connections" in line]
    assert accept_lines, served.errors[-20:]
    # The first failure, then one line per 10 s interval at most, never one per attempt (asyncio
    # retries thousands of times a second while the table is full).
    assert len(accept_lines) <= 2 + elapsed / 10, accept_lines
    assert any("times in the last 10 s" in line for line in accept_lines), accept_lines
    assert not any(ACCEPT_FAILED in line for line in served.errors), served.errors[-5:]
    assert not any(line.startswith("Traceback") for line in served.errors), served.errors[-20:]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_throttled_log_counts_what_it_does_not_print(caplog: object) -> None:
    clock = _Clock()
    records: list[logging.LogRecord] = []
    logger = logging.getLogger("tokenkeys.test.throttle")
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        log = ThrottledLog(logger, 10.0, clock=clock)
        for _ in range(1000):  # no running loop: the summary waits for the next occurrence
            log.note("accept", "cannot accept")
        assert len(records) == 1
        clock.now = 10.0
        log.note("accept", "cannot accept")
        assert len(records) == 2
        assert records[1].getMessage().startswith("cannot accept (1000 times in the last 10 s")
        assert log.totals == {"accept": 1001}
    finally:
        logger.removeHandler(handler)
