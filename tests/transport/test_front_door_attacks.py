"""Issue 16's attacks on a real ``tokenkeys serve`` process, on loopback, bounded in count and time.

Each test is one acceptance item of the issue. Latency is asserted only where the issue states a
bound ("answering within 1 s", "/health p99 under 200 ms"), and measured in the way the issue
measured it: ordinary blocking clients timing whole requests.
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import threading
import time

import grpc
from served import Served

from tokenkeys._gen.openengine.v1 import tokenizer_pb2, tokenizer_pb2_grpc

from dos_support import (
    H2_PREFACE,
    host_port,
    open_connections,
    rss_mb,
    wait_all_closed,
    want_descriptors,
)

MiB = 1 << 20

#: The issue's own bound on answers while the server is under attack.
ANSWER_WITHIN = 1.0
#: The issue's bound on /health's 99th percentile while a maximum-size /tokenize runs.
HEALTH_P99 = 0.200


def _timed_get(address: tuple[str, int], path: str) -> tuple[int, float]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status, time.perf_counter() - start
    finally:
        conn.close()


def _timed_tokenize(
    address: tuple[str, int], prompt: str, timeout: float = 10
) -> tuple[int, float]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection(*address, timeout=timeout)
    try:
        body = json.dumps({"prompt": prompt})
        conn.request("POST", "/tokenize", body, {"content-type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status, time.perf_counter() - start
    finally:
        conn.close()


def test_64_mib_of_headers_is_cut_short_and_leaves_no_memory_behind() -> None:
    with Served() as served:
        address = host_port(served.http_address)
        for _ in range(3):  # warm: the first requests allocate what any server keeps
            assert _timed_get(address, "/health")[0] == 200
        before = rss_mb(served.proc.pid)
        sock = socket.create_connection(address, timeout=10)
        # A small send buffer keeps what the kernel holds on our side small, so the bytes we
        # got to send bound what the server read (plus its receive buffer).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sent = 0
        line = b"X-Filler: " + b"a" * (MiB - 12) + b"\r\n"
        answer = b""
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            while sent < 64 * MiB:
                sent += sock.send(line)
        except OSError:
            pass  # closed by the server: what the test wants
        try:
            answer = sock.recv(4096)
        except OSError:
            answer = b""  # reset: the 431 was discarded with the unread input
        sock.close()
        assert sent < 64 * MiB, "the server read all 64 MiB of headers"
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:80]
        # What the client could push before the close: the server's 32 KiB cap, one read and
        # the two kernels' socket buffers. Under 1 MiB + buffers, far from 64 MiB.
        assert sent < 4 * MiB, f"{sent} bytes went out before the server closed"
        assert _timed_get(address, "/health")[0] == 200
        after = rss_mb(served.proc.pid)
        assert after - before < 20, f"RSS {before:.0f} MB before, {after:.0f} MB after"


def test_3000_slow_connections_do_not_stop_http_or_grpc_and_are_closed() -> None:
    count = 3000
    want_descriptors(count + 1024)
    # 12 source addresses x 250: every slow connection is under the per-client cap (256), so
    # the server holds all 3000 and must shed them by its header timeout.
    with Served("--http-header-timeout", "3") as served:
        address = host_port(served.http_address)
        channel = grpc.insecure_channel(served.grpc_target)
        stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
        slow = open_connections(address, count, sources=12, first=b"GET /health HTTP/1.1\r\n")
        latencies: list[float] = []
        failures: list[str] = []

        def probe() -> None:
            for send in (
                lambda: _timed_get(address, "/health"),
                lambda: _timed_tokenize(address, "Hello, world"),
            ):
                status, took = send()
                latencies.append(took)
                if status != 200:
                    failures.append(f"HTTP {status}")
            try:
                stub.Tokenize(tokenizer_pb2.TokenizeRequest(texts=["hi"]), timeout=ANSWER_WITHIN)
            except grpc.RpcError as exc:
                failures.append(f"gRPC {exc.code()}")

        def trickle_and_probe() -> None:
            for sock in slow:  # one header line a second, as the attacker
                try:
                    sock.send(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            probe()

        still_open = wait_all_closed(slow, timeout=25, every=trickle_and_probe)
        for sock in slow:
            sock.close()
        channel.close()
        assert still_open == 0, f"{still_open} slow connections outlived the header timeout"
        assert not failures, failures
        assert len(latencies) >= 4
        assert max(latencies) < ANSWER_WITHIN, sorted(latencies)[-5:]


def test_idle_grpc_connections_are_reclaimed_after_their_idle_limit() -> None:
    count = 1000
    want_descriptors(count + 1024)
    with Served("--grpc-max-connection-idle", "2") as served:
        idle = open_connections(host_port(served.grpc_target), count, first=H2_PREFACE)
        still_open = wait_all_closed(idle, timeout=25)
        for sock in idle:
            sock.close()
        assert still_open == 0, f"{still_open} idle gRPC connections were not closed"


def test_health_p99_while_a_maximum_size_tokenize_runs() -> None:
    # About 924k tokens from 3.9 MB: just under max_tokens_per_text (1,048,576), the largest
    # legal /tokenize of the default limits for this tokenizer.
    prompt = "hello world, this is a test of the tokenizer. " * 84_000
    with Served() as served:
        address = host_port(served.http_address)
        assert _timed_get(address, "/health")[0] == 200
        before = rss_mb(served.proc.pid)
        result: dict[str, int] = {}

        def big() -> None:
            result["status"] = _timed_tokenize(address, prompt, timeout=120)[0]

        worker = threading.Thread(target=big)
        worker.start()
        conn = http.client.HTTPConnection(*address, timeout=30)
        health: list[float] = []
        while worker.is_alive() or len(health) < 20:
            start = time.perf_counter()
            conn.request("GET", "/health")
            response = conn.getresponse()
            response.read()
            health.append(time.perf_counter() - start)
            assert response.status == 200
            time.sleep(0.02)  # a probe every ~20 ms, as a busy load balancer's health checks
        worker.join()
        conn.close()
        assert result["status"] == 200
        p99 = statistics.quantiles(health, n=100)[98]
        assert p99 < HEALTH_P99, f"/health p99 {p99 * 1000:.0f} ms over {len(health)} probes"
        # Memory returns: the heap is trimmed after a large request.
        after = rss_mb(served.proc.pid)
        assert after - before < 64, f"RSS {before:.0f} MB before, {after:.0f} MB after"
