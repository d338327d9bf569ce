"""``tokenkeys route`` shares the server's access control and shutdown: a bearer token on its
HTTP frontend (health exempt), loopback bind by default, a SIGTERM drain that exits 0; and it
reaches workers that require a token (discovery, artifacts, cache keys, events, generation)."""

from __future__ import annotations

import signal

import httpx
from engine_stack import ServeProcess
from route_process import RouteProcess

TOKEN = "route-token-0123456789abcdef"


def test_route_requires_its_token_and_drains_on_sigterm(tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n", encoding="utf-8")
    worker_token = tmp_path / "worker-token"
    worker_token.write_text("worker-token-0123456789abcdef\n", encoding="utf-8")
    with ServeProcess("--auth-token-file", str(worker_token)) as engine:
        args = ["--worker", engine.target, "--auth-token-file", str(token)]
        args += ["--worker-auth-token-file", str(worker_token)]
        with RouteProcess(*args, cache=str(tmp_path / "cache")) as router:
            assert router.url.startswith("http://127.0.0.1:")
            assert any(line.endswith("ready (smollm2-135m-instruct)") for line in router.lines)
            with httpx.Client(base_url=router.url, timeout=30) as client:
                assert client.get("/health").status_code == 200
                body = {"prompt": "hello", "max_tokens": 2}
                refused = client.post("/v1/completions", json=body)
                assert refused.status_code == 401
                headers = {"authorization": f"Bearer {TOKEN}"}
                ok = client.post("/v1/completions", json=body, headers=headers)
                assert ok.status_code == 200, ok.text
                # Signalled while the client's keep-alive connection is still open: a clean
                # drain closes it without uvicorn's "Cancel 0 running task(s)" ERROR line.
                router.proc.send_signal(signal.SIGTERM)
                assert router.proc.wait(30) == 0
            assert router.proc.stderr is not None
            assert "ERROR" not in router.proc.stderr.read()
    assert not any(TOKEN in line for line in router.lines)


def test_route_without_the_workers_token_does_not_admit_them(tmp_path) -> None:
    worker_token = tmp_path / "worker-token"
    worker_token.write_text("worker-token-0123456789abcdef\n", encoding="utf-8")
    with ServeProcess("--auth-token-file", str(worker_token)) as engine:
        with RouteProcess("--worker", engine.target, cache=str(tmp_path / "cache")) as router:
            assert not any(line.endswith("ready (smollm2-135m-instruct)") for line in router.lines)
            assert any("bearer token" in line for line in router.lines), router.lines
