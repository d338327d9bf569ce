"""Every shell block of README.md and docs/*.md is run by a test, or marked an example with why.

The convention is tests/doc_blocks.py's (and README.md's "Docs that run"): each fence names its
language (CLI synopses aside), and each ``bash``/``sh`` block carries, on the line above, either
``<!-- runs in tests/FILE.py::TEST -->`` (that test exists and reads the block from this doc)
or ``<!-- example, not run here: WHY -->``. The tests that run the blocks live beside what they
need (tests/test_readme.py: the tour on a real server; tests/peers: Dynamo's real indexer).
"""

from __future__ import annotations

import re
import shlex

from doc_blocks import SHELL, Block, blocks, documents, shell_block

from tokenkeys.cli import build_parser

from support import REPO

LANGUAGES = (*SHELL, "python", "json", "text")
#: A reason says what is missing here and what runs instead: a few words at least.
MIN_REASON_WORDS = 6


def problems(found: list[Block]) -> list[str]:
    """What breaks the convention in ``found``: one line each, naming the doc and the line."""
    out = []
    for block in found:
        where = f"{block.doc}:{block.line}"
        if block.lang not in LANGUAGES and not (
            block.lang == "" and block.above.startswith("<!-- synopsis:")
        ):
            out.append(f"{where}: a fence names its language, one of {', '.join(LANGUAGES)}")
        if block.lang not in SHELL:
            continue
        marker = block.marker
        if marker is None:
            out.append(
                f"{where}: a shell block needs '<!-- runs in tests/FILE.py::TEST -->' or "
                "'<!-- example, not run here: WHY -->' on the line above"
            )
        elif marker[0] == "runs in":
            out += [f"{where}: {p}" for p in _runner_problems(block.doc, marker[1])]
        elif len(marker[1].split()) < MIN_REASON_WORDS:
            out.append(f"{where}: an example says why it cannot run here ({marker[1]!r})")
    return out


def _runner_problems(doc: str, test: str) -> list[str]:
    path, _, name = test.partition("::")
    source = REPO / path
    if not (path.startswith("tests/") and source.is_file() and name):
        return [f"{test!r} is not tests/FILE.py::TEST of an existing file"]
    text = source.read_text(encoding="utf-8")
    if not re.search(rf"^(async )?def {re.escape(name)}\(", text, re.M):
        return [f"{path} defines no test {name}"]
    if f'"{doc}"' not in text:
        return [f"{path} does not read its block from {doc} (shell_block({doc!r}, ...))"]
    return []


def test_every_shell_block_is_run_by_a_test_or_marked_an_example() -> None:
    found = []
    for path in documents():
        read = blocks(path)
        # No fence escapes the reader (one indented in a list would).
        fences = re.findall(r"^[ \t]*```", path.read_text(encoding="utf-8"), re.M)
        assert len(fences) == 2 * len(read), f"{path.name}: a fence the reader does not see"
        found += read
    assert any(b.doc == "README.md" and b.lang in SHELL for b in found)  # read, not skipped
    assert problems(found) == []


def test_a_block_against_the_convention_is_found() -> None:
    def block(lang: str, above: str) -> Block:
        return Block("docs/x.md", 3, lang, above, "tokenkeys serve\n")

    runner = "tests/test_readme.py::test_the_tour_runs_as_written"
    found = problems(
        [
            block("", "some prose"),  # a fence without a language
            block("bash", "some prose"),  # no marker
            block("bash", "<!-- example, not run here: too short -->"),
            block("sh", "<!-- runs in tests/test_readme.py::test_nothing_of_that_name -->"),
            block("bash", "<!-- runs in tests/missing.py::test_x -->"),
            block("bash", f"<!-- runs in {runner} -->"),  # that test reads README.md only
            block("", "<!-- synopsis: serve -->"),  # fine
            block("text", "prose"),  # fine
        ]
    )
    assert [p.split(": ", 1)[1][:24] for p in found] == [
        "a fence names its langua",
        "a shell block needs '<!-",
        "an example says why it c",
        "tests/test_readme.py def",
        "'tests/missing.py::test_",
        "tests/test_readme.py doe",
    ]


def _ports(command: str) -> set[int]:
    words = shlex.split(command, comments=True)
    return {int(words[i + 1]) for i, w in enumerate(words[:-1]) if w.endswith("-port")}


def test_the_tours_servers_do_not_take_the_ports_of_the_readmes_first_command() -> None:
    # The first command is a bare ``tokenkeys serve``: it holds serve's default ports.
    first = next(b for b in blocks(REPO / "README.md") if b.lang in SHELL)
    assert "&& tokenkeys serve\n" in first.text
    defaults = build_parser().parse_args(["serve"])
    held = {defaults.grpc_port, defaults.http_port}
    tour = shell_block("README.md", "tests/test_readme.py::test_the_tour_runs_as_written")
    servers = [line for line in tour.splitlines() if re.match(r"tokenkeys (serve|route) ", line)]
    assert len(servers) == 2 and all(_ports(line) for line in servers)
    taken = set().union(*(_ports(line) for line in servers))
    assert not taken & held, f"the tour takes {sorted(taken & held)}, held by the first command"


def test_ci_runs_the_readmes_second_command_verbatim() -> None:
    # The first block's example marker says so: the second line is CI's whole test step.
    first = next(b for b in blocks(REPO / "README.md") if b.lang in SHELL)
    second = first.text.splitlines()[1]
    assert second in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
