"""The run's plan of real vLLM servers: which tests ask for which, in what order, and a head start.

A test names the servers it uses with the marker ``vllm_servers(config, ...)`` (on its module
or itself), or through a parameter that is a :class:`~vllm_server.ServerConfig` or carries them
as ``vllm_servers``. From that, at collection:

- the modules that use vLLM run after all the others, those sharing a configuration next to
  each other (the default configuration's first); in a module, the tests on the default
  configuration (or on no server) first, then the others grouped by the servers they ask for,
  each group in its order; so that every configuration is started once per run where the pool
  has room to keep it until its last user (with fewer places, Belady's rule below restarts
  the few it had to evict);
- :class:`Schedule` knows, per test, which configurations it needs; the server pool it builds
  evicts by that plan and starts the next configuration while the tests before it run;
- the engine environment and the tiny model are prepared in a background thread from the
  start of the run, and the first server started, while the tests that need no engine run.

``TOKENKEYS_VLLM_SERVERS`` caps how many servers the run holds at once; by default as many as
the memory available at start holds (about 4 GB each, 6 GB kept for everything else, at most 4);
either is shared among the xdist workers.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_env import vllm_python as build_vllm_python
from vllm_server import DEFAULT_CONFIG, STARTS, ServerConfig, Start, TinyModel, VllmServerPool

MARKER = "vllm_servers"
#: Fixtures of the engine environment: a module using them runs with the vLLM modules.
_ENGINE_FIXTURES = {"vllm_pool", "vllm_python", "tiny_model"}
CAPACITY_VARIABLE = "TOKENKEYS_VLLM_SERVERS"
_GIB = 1 << 30
_PER_SERVER = 4 * _GIB  # 3.2 GB measured, with room for its sidecar
_KEPT = 6 * _GIB
_PAIR = 2

EMBEDDED_TOKENIZER = (
    Path(__file__).resolve().parents[2] / "src" / "tokenkeys" / "data" / "smollm2-135m-instruct"
)
BUILDER = Path(__file__).resolve().parent / "build_tiny_model.py"


def servers_of(item: pytest.Item) -> tuple[ServerConfig, ...]:
    """The vLLM configurations ``item`` asks the pool for, in the order it names them."""
    configs: list[ServerConfig] = []
    for mark in reversed(list(item.iter_markers(MARKER))):  # the module's first, then the test's
        configs.extend(mark.args)
    callspec = getattr(item, "callspec", None)
    for value in callspec.params.values() if callspec else ():
        if isinstance(value, ServerConfig):
            configs.append(value)
        else:
            configs.extend(getattr(value, MARKER, ()))
    return tuple(dict.fromkeys(configs))


def engine_modules(items: Sequence[pytest.Item]) -> set[str]:
    """The modules (node id paths) with a test that uses a vLLM server or its environment."""
    return {
        module(item)
        for item in items
        if servers_of(item) or _ENGINE_FIXTURES & set(item.fixturenames)
    }


def order(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: modules without vLLM first, then those with it, the modules
    sharing a configuration next to each other (the default configuration's first); in a vLLM
    module, its tests grouped by the servers they ask for, the groups that use a server the
    module before left running first (it is still there), each group in its own order."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(module(item), []).append(item)
    engine = engine_modules(items)

    def module_rank(name: str) -> str:
        labels = sorted(c.label for i in modules[name] for c in servers_of(i) if not _default(c))
        return labels[0] if labels else ""

    ordered = [name for name in modules if name not in engine]
    ordered += sorted((name for name in modules if name in engine), key=module_rank)
    warm: set[ServerConfig] = {DEFAULT_CONFIG}  # the first server the schedule starts
    items.clear()
    for name in ordered:
        tests = modules[name]
        if name in engine:
            groups: dict[tuple[ServerConfig, ...], int] = {}
            for item in tests:
                groups.setdefault(servers_of(item), len(groups))
            ahead = {own for own in groups if warm & set(own)}
            tests = sorted(tests, key=lambda i: (servers_of(i) not in ahead, groups[servers_of(i)]))
            warm = set(servers_of(tests[-1])) or warm  # still running when the module ends
        items.extend(tests)


def _default(config: ServerConfig) -> bool:
    return replace(config, replica=0) == DEFAULT_CONFIG


def families(items: Sequence[pytest.Item]) -> dict[str, str]:
    """The modules that use pool servers, by family. The modules on the default configuration
    alone (and its second servers) are one family, ``vllm-default``; the others are joined by
    the configurations they share besides the default, each connected set a family named by
    its first configuration (the hybrid models and the adapter-less server are one, the key
    profiles' variants another). Each family runs in one process, so no configuration but
    the default starts in two; the default one is started again by a process that runs a
    family asking for it too (one start, for families that can run beside each other). A
    module that uses only the engine's environment or model (no pool server) is in no family:
    any process runs it."""
    own: dict[str, set[ServerConfig]] = {}
    for item in items:
        configs = servers_of(item)
        if configs:
            own.setdefault(module(item), set()).update(c for c in configs if not _default(c))
    parent = {name: name for name in own}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    holder: dict[ServerConfig, str] = {}
    for name, configs in own.items():
        for config in configs:
            if config in holder:
                parent[root(name)] = root(holder[config])
            else:
                holder[config] = name
    members: dict[str, set[ServerConfig]] = {}
    for name, configs in own.items():
        members.setdefault(root(name), set()).update(configs)
    named = {
        top: "vllm-" + min(c.label for c in configs) if configs else "vllm-default"
        for top, configs in members.items()
    }
    return {name: named[root(name)] if own[name] else "vllm-default" for name in own}


def check_declared(items: Sequence[pytest.Item]) -> None:
    """Refuse a test that takes the pool without naming its servers: it would start unplanned."""
    undeclared = [i.nodeid for i in items if "vllm_pool" in i.fixturenames and not servers_of(i)]
    if undeclared:
        raise pytest.UsageError(
            f"tests use vllm_pool without the {MARKER}(...) marker naming their servers: "
            + ", ".join(undeclared[:5])
        )


def capacity() -> int:
    """How many vLLM servers this process may run at once (see the module's docstring): the
    machine's share divided among the xdist workers, each of which may hold a pool."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    given = os.environ.get(CAPACITY_VARIABLE)
    if given:
        return max(_PAIR, int(given) // workers)
    available = _mem_available()
    if available is None:
        return 1
    # At least two: a test may hold two servers at once (a pair to route over), and a pool of
    # one would stop the first while the test's sidecar still waits on it.
    return max(_PAIR, min(4, (available - _KEPT) // _PER_SERVER) // workers)


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def module(item: pytest.Item) -> str:
    """The item's module, as its node id names it (``tests/x/test_y.py``)."""
    return item.nodeid.split("::", 1)[0]


def _run_builder(python: Path, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), str(BUILDER), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_HUB_OFFLINE": "1"},
    )


def build_tiny_model(python: Path, base: Path, vlm: bool = False) -> TinyModel:
    """A tiny random Llama with the embedded SmolLM2 tokenizer files, a LoRA adapter, and tiny
    hybrid models (one folder per layout) with the same tokenizer files, by the engine's torch;
    with ``vlm`` (a planned server serves it) also a tiny random SmolVLM (Idefics3) on the
    SmolVLM-layout tokenizer folder of ``tests/smolvlm_folder.py``."""
    folder, lora, hybrid = base / "model", base / "lora", base / "hybrid"
    args = [str(EMBEDDED_TOKENIZER), str(folder), str(lora), str(hybrid)]
    done = _run_builder(python, args)
    if done.returncode == 0 and vlm:
        from smolvlm_folder import build_smolvlm_folder

        tokenizer = build_smolvlm_folder(base / "smolvlm-tokenizer")
        done = _run_builder(python, ["--vlm", str(tokenizer), str(base / "vlm")])
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model failed: {done.stderr[-3000:]}")
    return TinyModel(folder, lora, hybrid, base / "vlm" if vlm else None)


class Schedule:
    """The run's plan and the pool built from it, prepared in the background from the start."""

    def __init__(self, items: Sequence[pytest.Item], workspace: Path, whole_run: bool = True):
        """``whole_run``: this process runs every collected test, in their order. An xdist
        worker runs the units it is handed, in the order it is handed them (xdist hands the
        largest first, whatever their place in the collection): it plans a family's tests
        from the moment it is handed one of them, after those it had."""
        family = families(items)
        self._engine = engine_modules(items)
        self._configs = {item.nodeid: servers_of(item) for item in items}
        self._family = {item.nodeid: family.get(module(item)) for item in items}
        self._members: dict[str, list[str]] = {}
        for item in items:
            if module(item) in family:
                self._members.setdefault(family[module(item)], []).append(item.nodeid)
        #: The family tests of this process, in the order it runs them; the cursor is the
        #: index of the last one that began (other tests leave it where it was).
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self._here: set[str] = set()
        if whole_run:
            self._here = set(self._members)
            self._order = [nodeid for nodeid in self._configs if self._family[nodeid]]
            self._index = {nodeid: index for index, nodeid in enumerate(self._order)}
        self._position = 0
        self._workspace = workspace
        self._pool: VllmServerPool | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _adopt(self, family: str) -> None:
        for nodeid in self._members[family]:
            self._index[nodeid] = len(self._order)
            self._order.append(nodeid)
        self._here.add(family)

    @property
    def plan(self) -> list[tuple[ServerConfig, ...]]:
        """The servers each of this process's family tests asks for, in the order it runs them."""
        return [self._configs[nodeid] for nodeid in self._order]

    @property
    def needed(self) -> bool:
        return any(self.plan)

    def begin(self, force: bool = False) -> None:
        """Build the environment and the model and start the first server, in the background
        (only when some test needs a server, unless ``force``)."""
        if (self.needed or force) and self._thread is None:
            self._thread = threading.Thread(target=self._prepare, name="vllm-schedule", daemon=True)
            self._thread.start()

    def pool(self) -> VllmServerPool:
        """The pool, once prepared; raises what preparing it raised (e.g. ``VenvUnavailable``)."""
        self.begin(force=True)
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._pool is not None, "a schedule without vLLM tests has no pool"
        return self._pool

    def at(self, item: pytest.Item) -> None:
        """``item`` runs now: move the plan's cursor, and start what comes next if there is room."""
        family = self._family.get(item.nodeid)
        if family is not None and family not in self._here:  # handed to this process
            self._adopt(family)
            if self._pool is not None:
                self._pool.plan = self.plan
        self._position = self._index.get(item.nodeid, self._position)
        if module(item) in self._engine:
            self.begin(force=True)  # where nothing began it early (an xdist worker)
        ready = self._thread is not None and not self._thread.is_alive()
        if ready and self._pool is not None:
            self._pool.look_ahead()

    def starts(self) -> list[Start]:
        """Every vLLM start of this process (the pool's and the others')."""
        return list(STARTS)

    def close(self) -> None:
        """Stop every server (after waiting for the preparation, if it is still going)."""
        if self._thread is not None:
            self._thread.join()
        if self._pool is not None:
            self._pool.close()

    def _prepare(self) -> None:
        try:
            python = build_vllm_python()
            vlm = any(c.vlm for wanted in self._configs.values() for c in wanted)
            model = build_tiny_model(python, self._workspace / "tiny-model", vlm)
            logs = self._workspace / "vllm-logs"
            logs.mkdir(parents=True, exist_ok=True)
            # No server is started here: a child's PR_SET_PDEATHSIG fires when the *thread*
            # that spawned it ends, so servers are spawned by the main thread (``at``).
            self._pool = VllmServerPool(
                python, model, logs, capacity(), self.plan, lambda: self._position
            )
        except BaseException as exc:  # handed to the first test that asks for the pool
            self._error = exc
