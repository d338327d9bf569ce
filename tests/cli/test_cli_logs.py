"""The log of ``serve`` and ``route`` as an operator reads it: real processes, every line parsed.

Every line of both streams, from the first, is a timestamped text line or (``--log-format
json``) a JSON object; the access log names method, route, status, duration, prompt tokens and,
behind ``route``, the worker; a start error is a log line too; ``--help`` shows the essential
options first and every option's default.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from engine_stack import ServeProcess
from route_process import RouteProcess

from tokenkeys.cli import build_parser
from tokenkeys.cli.help import ESSENTIALS, DefaultsFormatter

from support import REPO, run_cli

TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) [\w.]+: "
)


def serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    """``tokenkeys serve`` with stdout and stderr in files (read whole once it stopped)."""
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkeys.cli", "serve", "--grpc-port", "0", "--http-port", "0"]
        + list(args),
        stdout=out.open("w"),
        stderr=err.open("w"),
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    return proc, out, err


def wait_line(proc: subprocess.Popen, path: Path, needle: str, timeout: float = 120) -> str:
    """The first line of ``path`` holding ``needle`` (a safety-net deadline, not a criterion)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if needle in line:
                return line
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"no line with {needle!r}: {path.read_text()[-2000:]}")


def test_json_log_parses_from_the_first_line_with_an_access_line(tmp_path) -> None:
    proc, out, err = serve(tmp_path, "--log-format", "json", "--access-log", "--no-kv-events")
    try:
        line = wait_line(proc, out, "HTTP listening on ")
        address = json.loads(line)["message"].split()[-1]
        answer = httpx.post(
            f"http://{address}/v1/completions", json={"prompt": "Hello world", "max_tokens": 2}
        )
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        httpx.get(f"http://{address}/nowhere/{'x' * 8}")
        access = wait_line(proc, err, '"route": "unmatched"')
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    stdout = [json.loads(line) for line in out.read_text().splitlines()]
    stderr = [json.loads(line) for line in err.read_text().splitlines()]
    assert stdout[0]["logger"] == "tokenkeys.lifecycle" and stdout[-1]["message"] == "stopped"
    for record in stdout + stderr:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"]), record
        assert {"level", "logger", "message"} <= record.keys()
    completions = [r for r in stderr if r.get("route") == "/v1/completions"]
    assert len(completions) == 1, stderr
    (line,) = completions
    assert line["logger"] == "tokenkeys.access" and line["method"] == "POST"
    assert line["status"] == 200 and line["duration_ms"] >= 0
    assert line["prompt_tokens"] == usage["prompt_tokens"]
    assert "worker" not in line  # no router in front
    # A client's path never enters the log: an unmatched one is logged as such.
    assert json.loads(access)["status"] == 404 and "xxxxxxxx" not in err.read_text()


def test_text_log_lines_are_timestamped_from_the_first_start_error_included(tmp_path) -> None:
    proc, out, err = serve(tmp_path, "--log-level", "warning", "--no-kv-events")
    try:
        wait_line(proc, out, "HTTP listening on ")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    lines = out.read_text().splitlines() + err.read_text().splitlines()
    assert lines and all(TEXT_LINE.match(line) for line in lines), lines
    # The lifecycle lines are shown at any level; nothing below WARNING otherwise.
    assert all(" INFO tokenkeys.lifecycle: " in line for line in out.read_text().splitlines())
    assert not any(" INFO " in line for line in err.read_text().splitlines())
    refused = run_cli(
        "serve", "--log-format", "json", "--served-model-name", "a@b", "--grpc-port", "0",
        "--http-port", "0", check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    records = [json.loads(line) for line in refused.stderr.splitlines()]
    assert records[-1]["level"] == "ERROR" and "served model name 'a@b'" in records[-1]["message"]


def test_route_access_line_names_the_worker(tmp_path) -> None:
    with ServeProcess("--no-kv-events") as engine:
        args = ("--worker", engine.target, "--access-log")
        with RouteProcess(*args, cache=str(tmp_path / "cache")) as router:
            answer = httpx.post(
                f"{router.url}/v1/completions",
                json={"prompt": "Route me", "max_tokens": 2},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            router.proc.send_signal(signal.SIGINT)
            _, err = router.proc.communicate(timeout=30)
    (access,) = [x for x in err.splitlines() if " tokenkeys.access: POST /v1/completions " in x]
    assert TEXT_LINE.match(access)
    fields = dict(re.findall(r" (\w+)=(\S+)", access))
    assert fields["worker"] == engine.target == answer.headers["x-tokenkeys-worker"]
    assert int(fields["prompt_tokens"]) == answer.json()["usage"]["prompt_tokens"]
    assert fields["status"] == "200" and fields["method"] == "POST"
    assert float(fields["duration_ms"]) >= 0


@pytest.mark.parametrize("command", ["serve", "route"])
def test_help_shows_the_essentials_first_and_every_default(command: str) -> None:
    shown = run_cli(command, "--help").stdout
    groups = re.findall(r"^(\S[^\n]*):$", shown, flags=re.M)
    assert groups[0] == ESSENTIALS, groups
    parser = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices[command]
    formatter = DefaultsFormatter(command)
    for action in parser._actions:
        if action.default is argparse.SUPPRESS:
            continue  # --help
        text = formatter._get_help_string(action) or ""
        assert action.help, f"{action.option_strings} has no help"
        assert action.required or "default" in text, f"{action.option_strings}: {text}"
