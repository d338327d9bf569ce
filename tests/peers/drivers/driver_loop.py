"""The request loop every peer driver runs: one JSON request per stdin line, one JSON answer
per stdout line.

Runs inside a peer's own virtualenv (never the project's), so it uses the standard library
only. Library output must not corrupt the protocol: the real stdout is kept for answers and
file descriptor 1 is pointed at stderr before any peer module is imported.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

Handler = Callable[[dict[str, Any]], Any]


def protocol_stdout():  # noqa: ANN201 - a text file
    """The real stdout for answers; afterwards fd 1 (print, C extensions) goes to stderr."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return answers


def serve(handlers: dict[str, Handler], answers) -> None:  # noqa: ANN001 - a text file
    """Answer requests ``{"op": name, ...}`` with ``{"result": ...}`` or ``{"error": text}``
    until stdin closes."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            handler = handlers[request["op"]]
            answer = {"result": handler(request)}
        except Exception:  # noqa: BLE001 - every failure goes back to the test, in full
            answer = {"error": traceback.format_exc()}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
