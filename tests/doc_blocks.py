"""The fenced blocks of README.md and docs/*.md, their markers, and a runner for shell blocks.

The convention (README.md, "Docs that run"; enforced by tests/test_docs_blocks.py): every fence
names its language (``bash``/``sh`` for commands, ``python``, ``json``, ``text`` for formulas,
byte layouts and diagrams), except the CLI synopses ``scripts/gen_synopses.py`` writes under a
``<!-- synopsis: ... -->`` line. A shell block has, on the line before its fence, one of:

- ``<!-- runs in tests/FILE.py::TEST -->``: that test runs it as written, read from the doc
  (:func:`shell_block`), with only its ports swapped for free ones;
- ``<!-- example, not run here: WHY -->``: it cannot run on a test machine, and WHY says why
  (and, where one exists, which test runs the same thing on parts the suite has).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from support import REPO

SHELL = ("bash", "sh")
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"<!-- (runs in|example, not run here:) ?(.*?) ?-->")
# A command put in the background: everything before `` &``, its comment dropped.
_BACKGROUND = re.compile(r"^(?P<command>[^#\n]*?)\s&\s*(#.*)?$", re.M)


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its info string, the marker line above it, its text."""

    doc: str  # path relative to the repository, e.g. "docs/integrations.md"
    line: int  # the fence's line, 1-based
    lang: str
    above: str  # the line right above the fence
    text: str

    @property
    def marker(self) -> tuple[str, str] | None:
        """``("runs in", "tests/x.py::test_y")``, ``("example, not run here:", why)``, or None."""
        found = _MARKER.fullmatch(self.above.strip())
        return (found.group(1), found.group(2)) if found else None


def documents() -> list[Path]:
    """README.md and every docs/*.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        doc = path.relative_to(REPO).as_posix()
        found.append(Block(doc, line, match.group(1).strip(), before, match.group(2)))
    return found


def shell_block(doc: str, test: str) -> str:
    """The text of the one shell block of ``doc`` marked ``<!-- runs in {test} -->``."""
    marked = [b for b in blocks(REPO / doc) if b.lang in SHELL and b.marker == ("runs in", test)]
    assert len(marked) == 1, f"{doc} has {len(marked)} shell blocks marked 'runs in {test}'"
    return marked[0].text


def swap_ports(text: str, ports: Mapping[int, int]) -> str:
    """``text`` with each port number of ``ports`` (a whole number, not a part of one) swapped."""
    for doc_port, port in ports.items():
        text = re.sub(rf"(?<![\d.]){doc_port}(?!\d)", str(port), text)
    return text


def checkout_env(folder: Path) -> dict[str, str]:
    """The environment a block runs in: ``tokenkeys`` is this checkout's (a shim in
    ``folder/bin`` runs ``python -m tokenkeys.cli`` on its sources)."""
    shims = folder / "bin"
    shims.mkdir()
    (shims / "tokenkeys").write_text(f'#!/bin/sh\nexec {sys.executable} -m tokenkeys.cli "$@"\n')
    (shims / "tokenkeys").chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO / "src"),
    }


@dataclass(frozen=True)
class Ran:
    """What the foreground part of a block printed, and the background commands' logs."""

    stdout: str
    stderr: str
    logs: list[str]


@contextlib.contextmanager
def run_shell(
    text: str,
    *,
    cwd: Path,
    env: Mapping[str, str],
    listens: Mapping[str, list[int]],
    timeout: float = 300,
) -> Iterator[Ran]:
    """Run a shell block: its ``cmd &`` lines as background processes, then the rest in bash.

    Typed by hand, a background server has come up before the next line is read; here each one
    is waited for until every port ``listens`` lists for a word of its command accepts
    connections (a safety net, not a measurement). The rest runs with ``set -e`` and must exit
    0. The background processes are stopped (SIGINT, then SIGKILL) when the block is left.
    """
    background = [m.group("command").strip() for m in _BACKGROUND.finditer(text)]
    foreground = _BACKGROUND.sub("", text)
    started: list[tuple[subprocess.Popen, Path]] = []
    try:
        for number, command in enumerate(background):
            log = cwd / f"background-{number}.log"
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    ["bash", "-c", f"exec {command}"],
                    cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            started.append((process, log))
            ports = [p for word, ps in listens.items() if word in command for p in ps]
            _wait_listening(process, log, ports, timeout)
        done = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + foreground],
            cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        logs = [log.read_text(errors="replace") for _, log in started]
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr, logs)
        yield Ran(done.stdout, done.stderr, logs)
    finally:
        for process, _ in started:
            _stop(process)


def _wait_listening(process: subprocess.Popen, log: Path, ports: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    waiting = list(ports)
    while waiting:
        if process.poll() is not None:
            raise AssertionError(f"{process.args} exited: {log.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{process.args}: no port {waiting} after {timeout:.0f} s")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", waiting[0])) == 0:
                waiting.pop(0)
                continue
        time.sleep(0.2)


def _stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def parse_json_stream(text: str) -> list[object]:
    """The JSON documents printed one after another (curl prints no newline after a body)."""
    decoder = json.JSONDecoder()
    found, at = [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return found
        value, at = decoder.raw_decode(text, at)
        found.append(value)
