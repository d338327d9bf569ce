"""The one escape for printed and logged strings: control and bidi characters, nothing else."""

from __future__ import annotations

import io
import logging

import pytest

from tokenkeys.terminal import escape_log_records, printable


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain ascii", "plain ascii"),
        ("日本語 ünïcödé ☃", "日本語 ünïcödé ☃"),  # other scripts pass unchanged
        ("a\x1b[2Jb", "a\\x1b[2Jb"),  # ESC: a terminal escape sequence
        ("line\nforged", "line\\x0aforged"),  # a value stays one line (log injection)
        ("tab\there\r", "tab\\x09here\\x0d"),
        ("nul\x00del\x7f", "nul\\x00del\\x7f"),
        ("c1\x85\x9b", "c1\\x85\\x9b"),  # NEL and CSI of C1
        ("evil\u202etxt.exe", "evil\\u202etxt.exe"),  # RIGHT-TO-LEFT OVERRIDE
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),  # isolates
        ("\u200e\u200f\u061c", "\\u200e\\u200f\\u061c"),  # marks
        ("\u202a\u202b\u202c\u202d", "\\u202a\\u202b\\u202c\\u202d"),  # embeddings
        ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),  # line and paragraph separators
    ],
)
def test_printable_escapes_controls_and_bidi(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_printable_takes_any_object() -> None:
    assert printable(ValueError("x\u202ey")) == "x\\u202ey"


def test_log_records_are_escaped_with_their_arguments() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("tokenkeys.test.terminal")
    logger.propagate = False
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        escape_log_records(logger)
        escape_log_records(logger)  # idempotent: one filter per handler
        assert len(handler.filters) == 1
        logger.warning("worker %s said %s", "w\u202e1", "bad\nINFO forged line")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue() == "worker w\\u202e1 said bad\\x0aINFO forged line\n"
