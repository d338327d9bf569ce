"""docs/benchmarks.md stays generated: ``bench/run.py`` writes it back without losing analysis.

No benchmark runs here: the generator is driven on the recorded document (a run with nothing
selected re-renders it), and its parts are checked on the recorded blocks.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from support import REPO

DOCUMENT = REPO / "docs" / "benchmarks.md"


@pytest.fixture(scope="module")
def run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def _body(text: str) -> str:
    """The document past its generated header."""
    return text[text.index("<!-- ") :]


def test_every_line_is_in_a_block_a_run_writes_back(run: ModuleType) -> None:
    doc = run.parse(DOCUMENT.read_text(encoding="utf-8"))
    assert not doc.stray, "text outside the blocks would be dropped by the next run"
    assert len(doc.sections) >= 15 and doc.notes  # the parser read the file's blocks


def test_no_hand_edit_inside_a_generated_section(run: ModuleType) -> None:
    # A section is what its benchmark returned: analysis written into it is deleted by the
    # next run. It goes into the notes block after the section instead.
    doc = run.parse(DOCUMENT.read_text(encoding="utf-8"))
    edited = [name for name, text in doc.sections.items() if doc.recorded[name] != run.digest(text)]
    assert not edited, f"edited by hand (move the words to notes:NAME): {edited}"


def test_every_note_describes_the_figures_beside_it(run: ModuleType) -> None:
    # Notes record the digest of the section they were written against; a run that replaced
    # the figures leaves them describing figures that are gone until someone reads them again.
    doc = run.parse(DOCUMENT.read_text(encoding="utf-8"))
    assert set(doc.notes) <= set(doc.sections)
    assert not doc.stale_notes(), (
        f"notes written against earlier figures: {doc.stale_notes()}; make them true, then "
        "set their after: to the section's digest"
    )


def test_a_run_with_nothing_selected_writes_the_document_back(tmp_path: Path) -> None:
    # The generator end to end, without a benchmark: every block read is written back as it was.
    out = tmp_path / "benchmarks.md"
    recorded = DOCUMENT.read_text(encoding="utf-8")
    out.write_text(recorded, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--out", str(out), "no_such_bench"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert _body(out.read_text(encoding="utf-8")) == _body(recorded)


def test_a_run_replaces_its_section_and_keeps_every_note(run: ModuleType) -> None:
    recorded = DOCUMENT.read_text(encoding="utf-8")
    doc = run.parse(recorded)
    name = next(iter(doc.notes))
    notes, others = dict(doc.notes), {k: v for k, v in doc.sections.items() if k != name}
    doc.replace(name, "## New figures\n\n| a | b |\n|---|---:|\n| x | 1 |\n")
    again = run.parse(run.render(["# Benchmarks", ""], doc))
    assert again.sections[name] == "## New figures\n\n| a | b |\n|---|---:|\n| x | 1 |"
    assert again.notes == notes
    assert {k: v for k, v in again.sections.items() if k != name} == others
    # The notes now sit beside other figures: the run says so, and the check above would fail.
    assert again.stale_notes() == [name]


def test_text_outside_the_blocks_stops_a_run(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    recorded = DOCUMENT.read_text(encoding="utf-8")
    first_end = recorded.index("<!-- /bench:")
    cut = recorded.index("\n", first_end) + 1
    out.write_text(recorded[:cut] + "\nAn analysis typed here.\n" + recorded[cut:])
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--out", str(out), "no_such_bench"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "An analysis typed here." in done.stderr
    assert "An analysis typed here." in out.read_text()  # nothing was written
