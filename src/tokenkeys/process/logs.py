"""The log of a serving process: one format for every line, tokenkeys' and foreign libraries'.

:func:`configure` is called once per process (``serve``, ``route`` and each of their workers)
before anything is logged. Every record goes through one formatter:

- ``text``: ``2026-01-02T03:04:05.678Z INFO tokenkeys.serve: message`` (UTC, milliseconds), the
  fields of an access line appended as ``key=value``;
- ``json``: one object per line, ``{"ts", "level", "logger", "message", ...}`` with the
  record's fields (an access line's method, route, status...) as keys and an ``exc`` key for a
  traceback, so every line parses as JSON from the first one on.

Two streams, one format: the *lifecycle* records (what the server serves, where it listens,
draining, stopping: :data:`LIFECYCLE`, the lines scripts wait for) go to stdout; every other
record (warnings, errors, the access log, uvicorn's, asyncio's, Python warnings) goes to
stderr. Foreign libraries' loggers propagate to the root handler (uvicorn runs without a log
config of its own, Python warnings are captured); gRPC's C core writes to the file descriptor
itself, past any handler, so it is silenced (``GRPC_VERBOSITY=NONE``) unless the environment
sets it (:func:`quiet_grpc_core`, called before gRPC is imported). Every message is escaped
(:class:`~tokenkeys.terminal.EscapingFilter`): log lines carry client- and server-supplied text.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

from tokenkeys.errors import ConfigError
from tokenkeys.terminal import escape_log_records

#: ``--log-format`` values.
FORMATS = ("text", "json")
#: ``--log-level`` values, lowest first.
LEVELS = ("debug", "info", "warning", "error")
#: The logger of lifecycle lines (stdout): what is served, where, draining, stopped.
LIFECYCLE = "tokenkeys.lifecycle"
#: Fields a record carries beyond the standard ones: an access line's, put in ``extra``.
FIELDS_ATTR = "fields"

_TEXT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s"
_DATE = "%Y-%m-%dT%H:%M:%S"


class TextFormatter(logging.Formatter):
    """The text line: UTC time, level, logger, message, then ``key=value`` fields."""

    converter = time.gmtime

    def __init__(self) -> None:
        super().__init__(_TEXT, _DATE)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        line = super().formatMessage(record)
        fields = getattr(record, FIELDS_ATTR, None)
        if fields:
            line += "".join(f" {k}={v}" for k, v in fields.items() if v is not None)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module doc)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime(_DATE, time.gmtime(record.created))
        line: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(getattr(record, FIELDS_ATTR, None) or {})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class _Handler(logging.StreamHandler):
    """A handler :func:`configure` installed (so a second call replaces it)."""


class _Only(logging.Filter):
    """Passes the records of one logger (``keep``) or all but them."""

    def __init__(self, name: str, keep: bool) -> None:
        super().__init__()
        self.name_, self.keep = name, keep

    def filter(self, record: logging.LogRecord) -> bool:
        return (record.name == self.name_) == self.keep


def check(level: str, fmt: str) -> None:
    """``--log-level`` and ``--log-format`` are known values."""
    if level not in LEVELS:
        raise ConfigError(f"--log-level must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ConfigError(f"--log-format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def configure(
    level: str = "info",
    fmt: str = "text",
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> None:
    """Install the two handlers on the root logger (replacing those of an earlier call; other
    handlers, such as a test runner's, stay), at ``level``."""
    check(level, fmt)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _Handler):
            root.removeHandler(handler)
    formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    for stream, keep in ((stdout or sys.stdout), True), ((stderr or sys.stderr), False):
        handler = _Handler(stream)
        handler.setFormatter(formatter)
        handler.addFilter(_Only(LIFECYCLE, keep))
        root.addHandler(handler)
    root.setLevel(level.upper())
    # The lifecycle lines are what a script waits for: shown at any level.
    logging.getLogger(LIFECYCLE).setLevel(logging.INFO)
    # One line per request forwarded over HTTP (to a vLLM) would drown the log.
    logging.getLogger("httpx").setLevel(max(root.level, logging.WARNING))
    logging.captureWarnings(True)
    escape_log_records()


def configured() -> bool:
    """Whether :func:`configure` set up this process's log (a serving command runs)."""
    return any(isinstance(h, _Handler) for h in logging.getLogger().handlers)


def lifecycle() -> logging.Logger:
    """The logger of lifecycle lines (stdout)."""
    return logging.getLogger(LIFECYCLE)


def quiet_grpc_core() -> None:
    """Silence gRPC's C core, which writes past Python's handlers, unless the user set it."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
