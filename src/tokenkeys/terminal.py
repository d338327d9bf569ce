"""Text from elsewhere made safe for a terminal or a log: control and bidi characters escaped.

A server (or a request) chooses the strings tokenkeys prints: file names of a pulled manifest,
error messages of a worker, model names. Printed raw, a C0 or C1 control character can move the
cursor, rewrite the line or change the terminal's state (ESC sequences), and a Unicode bidi
control (U+202E RIGHT-TO-LEFT OVERRIDE and its kin) makes ``evil\\u202etxt.exe`` read as
``evilexe.txt``. :func:`printable` is the one escape every such string goes through:

- C0 controls (U+0000-U+001F, tab and newline included: a value is one line) and DEL (U+007F)
  as ``\\xNN``;
- C1 controls (U+0080-U+009F) as ``\\xNN``;
- bidi controls (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069) and the line and
  paragraph separators (U+2028, U+2029) as ``\\uNNNN``;

Everything else, other scripts included, passes unchanged. :func:`escape_log_records` applies
the same escape to every log line of the process.
"""

from __future__ import annotations

import logging
import re

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``str(text)`` with control and bidi characters escaped (see the module docstring)."""
    return _UNSAFE.sub(_escape, str(text))


class EscapingFilter(logging.Filter):
    """Escapes a record's message (with its arguments filled in) before any handler sees it.

    The traceback of an exception stays as Python formats it: its lines are ours, and the
    exception's own message is escaped where tokenkeys raises it for printing.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        escaped = printable(message)
        if escaped != message:
            record.msg = escaped
            record.args = None
        return True


def escape_log_records(logger: logging.Logger | None = None) -> None:
    """Install :class:`EscapingFilter` on every handler of ``logger`` (default: the root)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, EscapingFilter) for f in handler.filters):
            handler.addFilter(EscapingFilter())
