"""The layout's rules, read from the source: which room may import which, and module size.

Imports are parsed with :mod:`ast` (nothing is imported), so a rule broken only under
``TYPE_CHECKING`` or inside a function is still found.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from support import REPO

SRC = REPO / "src" / "tokenkeys"

#: (importer room, forbidden room): the router never reaches into the engine-side server, nor
#: the server into the router; the HTTP frontend serves both and so depends on neither.
FORBIDDEN = [
    ("router", "server"),
    ("server", "router"),
    ("frontend", "server"),
    ("frontend", "router"),
]

#: Longest module, in lines, outside generated code: split by concept before this.
MAX_LINES = 400
#: Modules allowed past it, with their own bound and the reason.
LONGER = {
    # vLLM's msgpack layout of every supported release in one place; the events work under way
    # in parallel (performance) edits it, so its split waits for that to land.
    "events/vllm_codec.py": 430,
}


def _modules() -> list[Path]:
    return sorted(
        p for p in SRC.rglob("*.py") if not any(part.startswith("_gen") for part in p.parts)
    )


def _room(path: Path) -> str:
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def _imported(path: Path) -> set[str]:
    """Every ``tokenkeys`` module ``path`` imports, absolute or relative, at any depth."""
    package = ["tokenkeys", *path.relative_to(SRC).parent.parts]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {m for m in found if m.startswith("tokenkeys.")}


def test_the_rule_is_read_from_real_imports() -> None:
    # The parser sees the imports this rule is about (a rule that reads nothing cannot fail).
    frontend_app = _imported(SRC / "frontend" / "app.py")
    assert "tokenkeys.serving.models" in frontend_app
    routed = _imported(SRC / "router" / "routed_engine.py")
    assert any(m.startswith("tokenkeys.router.") for m in routed)


@pytest.mark.parametrize(("importer", "forbidden"), FORBIDDEN)
def test_rooms_import_one_way(importer: str, forbidden: str) -> None:
    broken = [
        f"{path.relative_to(SRC)} imports {module}"
        for path in _modules()
        if _room(path) == importer
        for module in sorted(_imported(path))
        if module.split(".")[1] == forbidden
    ]
    assert not broken, "\n".join(broken)


def test_modules_stay_small() -> None:
    long = [
        f"{path.relative_to(SRC)}: {n} lines"
        for path in _modules()
        if (n := len(path.read_text(encoding="utf-8").splitlines()))
        > LONGER.get(path.relative_to(SRC).as_posix(), MAX_LINES)
    ]
    assert not long, "split these modules by concept:\n" + "\n".join(long)
