"""The run's plan of real vLLM servers: which tests ask for which, in what order, and a head start.

A test names the servers it uses with the marker ``vllm_servers(config, ...)`` (on its module
or itself), or through a parameter that is a :class:`~vllm_server.ServerConfig` or carries them
as ``vllm_servers``. From that, at collection:

- the modules that use vLLM run after all the others, those sharing a configuration next to
  each other (the default configuration's first), each module's tests in their own order, so
  that every configuration is started once per run where the pool has room to keep it until
  its last user (with fewer places, Belady's rule below restarts the few it had to evict);
- :class:`Schedule` knows, per test, which configurations it needs; the server pool it builds
  evicts by that plan and starts the next configuration while the tests before it run;
- the engine environment and the tiny model are prepared in a background thread from the
  start of the run, and the first server started, while the tests that need no engine run.

``TOKENKEYS_VLLM_SERVERS`` caps how many servers a process runs at once; by default as many as
the memory available at start holds (about 4 GB each, 6 GB kept for everything else, at most 4),
shared among the xdist workers.
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
from vllm_server import DEFAULT_CONFIG, ServerConfig, TinyModel, VllmServerPool

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
    """Reorder ``items`` in place: modules without vLLM first, then those with it, grouped."""
    modules: dict[str, list[ServerConfig]] = {}
    for item in items:
        modules.setdefault(module(item), []).extend(servers_of(item))
    engine = engine_modules(items)
    first = {name: index for index, name in enumerate(modules)}

    def rank(item: pytest.Item) -> tuple:
        name = module(item)
        configs = modules[name]
        if name not in engine:
            return (0, first[name])
        others = sorted(c.label for c in configs if replace(c, replica=0) != DEFAULT_CONFIG)
        return (1, others[0] if others else "", first[name])

    items.sort(key=rank)  # stable: a module's tests keep their order


def families(items: Sequence[pytest.Item]) -> dict[str, str]:
    """The vLLM modules by family: ``vllm-lora`` for those whose first server serves the tiny
    Llama with its adapter (the default configuration and the key profiles' variants), or that
    start no pool server, ``vllm-other`` for the rest (hybrid models, the adapter-less server).
    Each family runs in one process, so two processes split the engines between them and
    neither starts a configuration the other holds."""
    first: dict[str, ServerConfig | None] = {}
    for item in items:
        name = module(item)
        if first.get(name) is None:
            configs = servers_of(item)
            first[name] = configs[0] if configs else None
    return {
        name: "vllm-lora" if config is None or (config.lora and not config.hybrid) else "vllm-other"
        for name, config in first.items()
        if name in engine_modules(items)
    }


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
    given = os.environ.get(CAPACITY_VARIABLE)
    if given:
        return max(1, int(given))
    available = _mem_available()
    if available is None:
        return 1
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
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
        """``whole_run``: this process runs every collected test. An xdist worker runs only the
        units it is handed; it plans for the families of vLLM modules it has been handed."""
        self._wanted = [servers_of(item) for item in items]
        family = families(items)
        self._family = [family.get(module(item)) for item in items]
        self._here: set[str | None] = set(self._family) if whole_run else set()
        self._engine = engine_modules(items)
        self._index = {item.nodeid: index for index, item in enumerate(items)}
        self._position = 0
        self._workspace = workspace
        self._pool: VllmServerPool | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def plan(self) -> list[tuple[ServerConfig, ...]]:
        """Per collected test, the servers it asks for, if this process will run it."""
        pairs = zip(self._wanted, self._family, strict=True)
        return [configs if family in self._here else () for configs, family in pairs]

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
        self._position = self._index.get(item.nodeid, self._position)
        if module(item) in self._engine:
            family = self._family[self._position]
            if family not in self._here:  # a unit of this family was handed to this process
                self._here.add(family)
                if self._pool is not None:
                    self._pool.plan = self.plan
            self.begin(force=True)  # where nothing began it early (an xdist worker)
        ready = self._thread is not None and not self._thread.is_alive()
        if ready and self._pool is not None:
            self._pool.look_ahead()

    def starts(self) -> list[tuple[str, float | None]]:
        """Every vLLM start of the run: (label, seconds until healthy, None if never)."""
        return list(self._pool.starts) if self._pool is not None else []

    def close(self) -> None:
        """Stop every server (after waiting for the preparation, if it is still going)."""
        if self._thread is not None:
            self._thread.join()
        if self._pool is not None:
            self._pool.close()

    def _prepare(self) -> None:
        try:
            python = build_vllm_python()
            vlm = any(c.vlm for wanted in self._wanted for c in wanted)
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
