"""Generate the CLI synopses in docs/ from the parser itself, so no option goes unmentioned.

Usage: python3 scripts/gen_synopses.py [--check]

A synopsis block in a Markdown file is a fenced block right after a marker line
``<!-- synopsis: COMMAND [COMMAND...] -->``; it holds ``tokenkeys COMMAND`` with every option
of that command, in the parser's order: ``[--opt VALUE]`` (no brackets when required), ``...``
after a repeatable one, ``a|b`` for choices, one ``[--a | --b]`` for each mutually exclusive
group. ``--check`` writes nothing and exits 1 when a block differs from a regeneration
(tests/test_docs_synopses.py runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The Markdown files holding synopsis blocks.
DOCS = [ROOT / "docs" / "api.md", ROOT / "docs" / "router.md"]
WIDTH = 100
MARKER = re.compile(r"^<!-- synopsis: ([a-z ]+) -->\n```\n(.*?)```\n", re.M | re.S)


def commands() -> dict[str, argparse.ArgumentParser]:
    """Each ``tokenkeys`` subcommand's parser, by name."""
    sys.path.insert(0, str(ROOT / "src"))
    from tokenkeys.cli import build_parser

    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        value = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        value = "|".join(str(c) for c in action.choices)
    else:
        value = action.dest.upper()
    return f"{value}..." if action.nargs in ("*", "+") else value


def _term(action: argparse.Action) -> str:
    """One action without brackets: ``--opt VALUE``, ``--a | --no-a``, or a positional."""
    value = _value(action)
    if not action.option_strings:
        return value
    names = [s for s in action.option_strings if s.startswith("--")] or action.option_strings
    return " | ".join(f"{name} {value}" if value else name for name in names)


def _item(action: argparse.Action) -> str:
    term = _term(action)
    if not action.option_strings:
        return term if action.nargs not in ("?", "*") else f"[{term}]"
    repeat = "..." if isinstance(action, argparse._AppendAction) else ""
    return f"{term}{repeat}" if action.required else f"[{term}]{repeat}"


def synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    """``tokenkeys NAME`` and every option of it, wrapped at :data:`WIDTH` columns."""
    groups = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    items, done = [], set()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or id(action) in done:
            continue
        group = groups.get(id(action))
        if group is None:
            items.append(_item(action))
            continue
        members = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        done.update(id(a) for a in members)
        inner = " | ".join(_term(a) for a in members)
        items.append(f"({inner})" if group.required else f"[{inner}]")
    # Each item whole on its line (an option never parted from its value).
    head = f"tokenkeys {name}"
    lines, line = [], head
    for item in items:
        if len(line) + 1 + len(item) > WIDTH and line != head and line.strip():
            lines.append(line)
            line = " " * len(head)
        line += " " + item
    return "\n".join([*lines, line])


def render(text: str, parsers: dict[str, argparse.ArgumentParser]) -> str:
    """``text`` with every synopsis block regenerated."""

    def block(match: re.Match) -> str:
        names = match.group(1).split()
        body = "\n".join(synopsis(n, parsers[n]) for n in names)
        return f"<!-- synopsis: {match.group(1)} -->\n```\n{body}\n```\n"

    return MARKER.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--check", action="store_true", help="write nothing; exit 1 on a difference")
    check = args.parse_args(argv).check
    parsers = commands()
    stale = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        new = render(text, parsers)
        if new != text:
            stale.append(path.relative_to(ROOT).as_posix())
            if not check:
                path.write_text(new, encoding="utf-8")
    if stale and check:
        print(f"stale CLI synopses in {', '.join(stale)}: run python3 scripts/gen_synopses.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
