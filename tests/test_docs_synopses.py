"""The CLI synopses in docs/ are the parser's: a missing or stale option fails here.

``scripts/gen_synopses.py`` writes every synopsis block from ``tokenkeys.cli.build_parser``;
this test regenerates them and compares, so an option added to the code and not to the docs
(or a renamed one) is found before review.
"""

from __future__ import annotations

import importlib.util

from support import REPO


def _generator():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(
        "gen_synopses", REPO / "scripts" / "gen_synopses.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_synopsis_block_lists_every_option_of_its_command() -> None:
    gen = _generator()
    parsers = gen.commands()
    found = []
    for path in gen.DOCS:
        text = path.read_text(encoding="utf-8")
        found += [n for m in gen.MARKER.finditer(text) for n in m.group(1).split()]
        assert gen.render(text, parsers) == text, (
            f"{path.relative_to(REPO)} lags the CLI: run python3 scripts/gen_synopses.py"
        )
    # Every command has a synopsis in api.md, and route and parity one in router.md too.
    assert sorted(found) == sorted([*parsers, "route", "parity"])


def test_a_synopsis_without_an_option_is_found() -> None:
    gen = _generator()
    parsers = gen.commands()
    good = gen.render("<!-- synopsis: route -->\n```\n```\n", parsers)
    assert "[--processes N]" in good and "--worker HOST:PORT[,URL]..." in good
    stale = good.replace(" [--processes N]", "")
    assert gen.render(stale, parsers) == good
