"""A fronted engine's log says when it goes down and when it is back, once each."""

from __future__ import annotations

import logging

from tokenkeys.engine.fronted import UpDown


def test_one_line_down_and_one_back(caplog) -> None:
    watch = UpDown("vLLM at http://10.0.0.7:8000")
    with caplog.at_level(logging.INFO, logger="tokenkeys.engine.fronted"):
        for problem in (None, "connect refused", "connect refused", "503", None, None):
            watch.saw(problem)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("WARNING", "vLLM at http://10.0.0.7:8000 is down: connect refused"),
        ("INFO", "vLLM at http://10.0.0.7:8000 is back"),
    ]
