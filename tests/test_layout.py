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
    # Every engine kind lives in engine/ and is built from what it needs, never from the
    # serving layers (a ServedModel) nor from a face of a server.
    *[("engine", room) for room in ("server", "router", "frontend", "serving", "cli", "process")],
    # The process room runs servers; it does not know which.
    *[("process", room) for room in ("server", "router", "frontend", "cli")],
    ("client", "server"),
    # The cores the faces serve (derendering an answer, preprocessing a request) know no face.
    *[(core, room) for core in ("derender", "preprocess") for room in ("frontend", "server")],
]

#: The router's rooms, lowest first: each imports only the rooms before it (data flows one way:
#: the index, the events that feed it, the workers followed, the policies choosing among them,
#: the explanations of what they found, what replicas share of those choices).
ROUTER_ROOMS = ["index", "ingest", "workers", "policy", "explain", "replicas"]

#: Modules of engine kinds (``engine.registry.KINDS`` names them): only engine/ imports them,
#: and the router, whose workers are remote engines.
KIND_MODULES = ("tokenkeys.engine.simulated", "tokenkeys.engine.remote", "tokenkeys.engine.vllm")
KIND_IMPORTERS = {"engine", "router"}
#: (module, kind module) allowed anyway: the simulated kind's latency is part of its settings.
KIND_EXCEPTIONS = {
    ("cli/engine_options.py", "tokenkeys.engine.simulated.latency"),
    ("engine/config.py", "tokenkeys.engine.simulated.latency"),
}

#: Longest module, in lines, outside generated code: split by concept before this.
MAX_LINES = 400


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


def test_router_rooms_import_downwards() -> None:
    broken = []
    for path in _modules():
        parts = path.relative_to(SRC).parts
        if parts[0] != "router" or len(parts) < 3 or parts[1] not in ROUTER_ROOMS:
            continue
        allowed = ROUTER_ROOMS[: ROUTER_ROOMS.index(parts[1]) + 1]
        broken += [
            f"{path.relative_to(SRC)} imports {module}"
            for module in sorted(_imported(path))
            if module.split(".")[1] == "router"
            and len(module.split(".")) > 2
            and module.split(".")[2] in ROUTER_ROOMS
            and module.split(".")[2] not in allowed
        ]
    assert not broken, "\n".join(broken)


#: Trees whose modules must not import each other in a circle: (folder, its package prefix).
#: bench/ modules import each other by bare name (the folder is on ``sys.path``).
TREES = [(SRC, ("tokenkeys",)), (REPO / "bench", ())]


def _files(root: Path, prefix: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every module below ``root`` (a package: its __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if any(part.startswith("_gen") or part == "__pycache__" for part in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([*prefix, *parts])] = path
    return out


def _imported_files(path: Path, root: Path, prefix: tuple[str, ...], files: dict) -> set[Path]:
    """The files of the tree that ``path`` imports (anywhere in it: ``TYPE_CHECKING``, inside
    a function). ``from pkg import mod`` is an import of ``mod``; of ``pkg`` only for a name
    that is not a module."""
    package = [*prefix, *path.relative_to(root).parent.parts]
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in files:  # import a.b.c executes a.b.c, found here
                    name = name.rpartition(".")[0]
                if name:
                    found.add(files[name])
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            named = [files.get(f"{module}.{alias.name}") for alias in node.names]
            found.update(f for f in named if f is not None)
            if None in named and module in files:
                found.add(files[module])
    found.discard(path)
    return found


def _circles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """The strongly connected components of more than one file (Tarjan): each is a circle."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    out: list[list[Path]] = []

    def visit(node: Path) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def _graph(root: Path, prefix: tuple[str, ...]) -> dict[Path, set[Path]]:
    files = _files(root, prefix)
    return {path: _imported_files(path, root, prefix, files) for path in files.values()}


def test_the_circle_finder_reads_real_imports_and_finds_a_circle() -> None:
    # Fed from the code (a finder that reads nothing, or never reports, cannot fail).
    graph = _graph(SRC, ("tokenkeys",))
    assert SRC / "keys" / "vectors.py" in graph[SRC / "keys" / "make.py"]
    assert (
        SRC / "server" / "runtime" / "state.py" in graph[SRC / "server" / "runtime" / "streamed.py"]
    )
    bench = REPO / "bench"
    assert bench / "routing_workload.py" in _graph(bench, ())[bench / "routing_processes.py"]
    a, b, c = Path("a.py"), Path("b.py"), Path("c.py")
    assert _circles({a: {b}, b: {a}, c: {a}}) == [[a, b]]
    assert _circles({a: {b}, b: {c}, c: {a}}) == [[a, b, c]]
    assert _circles({a: {b}, b: {c}, c: set()}) == []


@pytest.mark.parametrize(("root", "prefix"), TREES, ids=["src", "bench"])
def test_no_import_circle(root: Path, prefix: tuple[str, ...]) -> None:
    # Two files that import each other (directly or around a longer circle) are one concept
    # split in two, or a concept missing below both: cut where the concept says, so data flows
    # one way. Imports under TYPE_CHECKING or inside a function count as well.
    graph = _graph(root, prefix)
    found = [
        " <-> ".join(p.relative_to(root).as_posix() for p in circle)
        + "".join(
            f"\n  {a.relative_to(root)} imports {b.relative_to(root)}"
            for a in circle
            for b in sorted(graph[a] & set(circle))
        )
        for circle in _circles(graph)
    ]
    assert not found, "import circles:\n" + "\n".join(found)


#: Folders of tests/ that are not a room of src/: data, the peers' code, the real-vLLM harness.
NOT_ROOMS = {"data", "peers", "realengine", "__pycache__"}


def test_tests_mirror_src() -> None:
    # Each test folder is named after the src/ room (or sub-room) it tests.
    tests = REPO / "tests"
    unmatched = [
        folder.relative_to(tests).as_posix()
        for folder in sorted(tests.rglob("*"))
        if folder.is_dir()
        and not NOT_ROOMS & set(folder.relative_to(tests).parts)
        and not (SRC / folder.relative_to(tests)).is_dir()
    ]
    assert not unmatched, f"test folders without a src/ room: {unmatched}"


def test_modules_stay_small() -> None:
    long = [
        f"{path.relative_to(SRC)}: {n} lines"
        for path in _modules()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert not long, "split these modules by concept:\n" + "\n".join(long)


def _is_kind(module: str) -> bool:
    return any(module == k or module.startswith(k + ".") for k in KIND_MODULES)


def _excepted(path: Path, module: str) -> bool:
    where = path.relative_to(SRC).as_posix()
    return any(where == w and module.startswith(m) for w, m in KIND_EXCEPTIONS)


def test_engine_kinds_are_imported_by_engine_only() -> None:
    # The server hosts every kind through engine.registry and engine.hosting: importing a kind
    # would be the first step of branching on it.
    broken = [
        f"{path.relative_to(SRC)} imports {module}"
        for path in _modules()
        if _room(path) not in KIND_IMPORTERS
        for module in sorted(_imported(path))
        if _is_kind(module) and not _excepted(path, module)
    ]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("module", ["protocol.py", "hosting.py", "registry.py", "config.py"])
def test_the_engine_interface_imports_no_kind(module: str) -> None:
    # engine/protocol.py holds what every kind shares; a kind importing it must not be
    # imported back (the circle engine/core.py once made). The registry names kinds as text.
    found = {
        m
        for m in _imported(SRC / "engine" / module)
        if _is_kind(m) and not _excepted(SRC / "engine" / module, m)
    }
    assert not found, f"engine/{module} imports {sorted(found)}"


def _kind_classes() -> set[str]:
    """Classes defined in the modules of engine kinds and the router's routed engine."""
    names = set()
    roots = [SRC / "engine" / "simulated", SRC / "engine" / "vllm"]
    files = [p for root in roots for p in root.rglob("*.py")]
    files += [SRC / "engine" / "remote.py", SRC / "router" / "routed_engine.py"]
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names.update(n.name for n in tree.body if isinstance(n, ast.ClassDef))
    return names


def test_no_isinstance_on_engine_kinds_outside_engine() -> None:
    kinds = _kind_classes()
    assert {"LocalEngine", "RemoteEngine", "VllmSidecarEngine", "RoutedEngine"} <= kinds
    broken = []
    for path in _modules():
        if _room(path) == "engine":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
            ):
                continue
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if named & kinds:
                broken.append(f"{path.relative_to(SRC)}:{node.lineno} {sorted(named & kinds)}")
    assert not broken, "host through engine.hosting instead:\n" + "\n".join(broken)


def test_no_class_name_is_defined_twice() -> None:
    # One word per concept: two classes of one name (two Engines once) read as one.
    where: dict[str, list[str]] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, "\n".join(f"{name}: {', '.join(p)}" for name, p in sorted(twice.items()))
