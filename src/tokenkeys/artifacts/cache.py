"""The content-addressed tokenizer cache: ``<cache>/<fingerprint>/``, complete or absent.

An entry appears only by an atomic rename of a fully verified temporary folder
(``<cache>/.partial-...``, on the same file system), so a reader never sees a half-written
tokenizer. Each entry holds the tokenizer files and ``tokenkeys-manifest.json``: the identity
needed to recompute the fingerprint offline, and, per served model name, the server it came from
and when it was last used (what :meth:`ArtifactCache.prune` keeps or drops). The tokenizer loader
reads only the tokenizer files, so this record never enters the fingerprint.

Every lookup re-reads an entry and recomputes its fingerprint before handing it out, so even a
copy torn by a power loss (files are not fsynced) or damaged later on disk is never used: it is
removed and pulled again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenkeys.artifacts.faults import fault
from tokenkeys.errors import FailedPrecondition, InvalidArgument, TokenizerLoadError
from tokenkeys.tokenizer import FileEntry, Tokenizer, TokenizerOptions, fingerprint, read_folder

log = logging.getLogger(__name__)

CACHE_ENV = "TOKENKEYS_CACHE"
METADATA_FILE = "tokenkeys-manifest.json"
METADATA_FORMAT = "tokenkeys.cache/1"
PARTIAL_PREFIX = ".partial-"
_TRASH_PREFIX = ".trash-"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# A partial folder whose writer is gone is removed by prune after this long (another host
# sharing the cache may reuse the pid, hence the age condition too).
_STALE_PARTIAL_SECONDS = 600.0
_ABANDONED_PARTIAL_SECONDS = 86_400.0


def default_cache_dir() -> Path:
    """``$TOKENKEYS_CACHE``, else ``$XDG_CACHE_HOME/tokenkeys/tokenizers`` or ``~/.cache/...``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tokenkeys" / "tokenizers"


@dataclass(frozen=True)
class Installed:
    """A verified tokenizer in the cache: where it is and how to load it with its fingerprint.

    ``transferred`` is the number of file bytes received for it (0 on a cache hit).
    """

    fingerprint: str
    path: Path
    options: TokenizerOptions
    behaviour: str
    transferred: int = 0
    from_cache: bool = False

    def load(self) -> Tokenizer:
        """Load the tokenizer; refuse when this host's backend does not reproduce the fingerprint.

        The files are verified; a different fingerprint here means the local backend behaves
        differently from the server's (another ``behaviour`` string), so its ids could differ.
        """
        tokenizer = Tokenizer.load(self.path, self.options)
        if tokenizer.fingerprint != self.fingerprint:
            raise FailedPrecondition(
                f"{self.path}: the files are verified, but this host's {self.options.backend} "
                f"backend has behaviour {tokenizer.backend.behaviour!r} where the server's is "
                f"{self.behaviour!r}, so it would not tokenize identically (fingerprint "
                f"{tokenizer.fingerprint} instead of {self.fingerprint}); install the backend "
                "version the server runs",
                field="backend",
                fingerprint=self.fingerprint,
            )
        return tokenizer


@dataclass(frozen=True)
class CacheEntry:
    """One cached tokenizer: fingerprint, folder, size and, per model name, last use."""

    fingerprint: str
    path: Path
    size: int
    last_used: dict[str, float] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)


class ArtifactCache:
    """A cache folder of verified tokenizers, one ``<fingerprint>/`` folder each."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()

    def path_of(self, fp: str) -> Path:
        """The folder of fingerprint ``fp`` (whether or not it is cached)."""
        if not _HEX64.match(fp):
            raise InvalidArgument(
                f"fingerprint {fp!r} is not 64 lowercase hex characters", field="fingerprint"
            )
        return self.root / fp

    def lookup(self, fp: str) -> Installed | None:
        """The verified entry of ``fp``, or None; an entry that fails verification is removed.

        Verification re-reads the files and recomputes the fingerprint from them and the
        recorded identity, so a file damaged on disk is never used.
        """
        path = self.path_of(fp)
        if not path.is_dir():
            return None
        try:
            meta = _read_metadata(path)
            options = TokenizerOptions(**meta["options"])
            behaviour = str(meta["behaviour"])
            folder = read_folder(path)
            actual = fingerprint(folder.entries, options, behaviour)
        except (OSError, KeyError, TypeError, ValueError, TokenizerLoadError) as exc:
            actual = f"unreadable ({exc})"
        if actual != fp:
            error = fault(
                str(path), "cache-corrupt", f"does not verify (got {actual}); removing it"
            )
            log.warning("%s", error.message)
            self.remove(fp)
            return None
        return Installed(fp, path, options, behaviour, 0, True)

    def new_partial(self, fp: str) -> Path:
        """A fresh temporary folder inside the cache, for one transfer of ``fp``."""
        self.root.mkdir(parents=True, exist_ok=True)
        prefix = f"{PARTIAL_PREFIX}{fp[:16]}-{os.getpid()}-"
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.root))

    def commit(
        self,
        partial: Path,
        fp: str,
        files: Iterable[FileEntry],
        options: TokenizerOptions,
        behaviour: str,
        origin: tuple[str, str] | None,
    ) -> Path:
        """Record the identity in ``partial`` and rename it to ``<cache>/<fp>`` atomically.

        When another process installed the same fingerprint first, its folder is kept (the
        content is the same by construction) and ``partial`` is discarded.
        """
        now = time.time()
        meta = {
            "format": METADATA_FORMAT,
            "fingerprint": fp,
            "files": [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in files],
            "options": options.identity(),
            "behaviour": behaviour,
            "installed": now,
            "origins": {},
        }
        if origin is not None:
            meta["origins"][origin[0]] = {"target": origin[1], "last_used": now}
        _write_json(partial / METADATA_FILE, meta)
        final = self.path_of(fp)
        try:
            os.rename(partial, final)
        except OSError:
            if not final.is_dir():
                raise
            self.discard(partial)
            if origin is not None:
                self.touch(fp, *origin)
        return final

    def discard(self, partial: Path) -> None:
        """Remove a temporary folder and everything in it."""
        shutil.rmtree(partial, ignore_errors=True)

    def touch(self, fp: str, model: str, target: str) -> None:
        """Record that ``fp`` was just used for ``model`` served at ``target``."""
        path = self.path_of(fp)
        try:
            meta = _read_metadata(path)
        except (OSError, ValueError):
            return
        origins = meta.setdefault("origins", {})
        origins[model] = {"target": target, "last_used": time.time()}
        _write_json(path / METADATA_FILE, meta)

    def entries(self) -> list[CacheEntry]:
        """Every cached tokenizer, most recently used first."""
        found = []
        if not self.root.is_dir():
            return []
        for path in self.root.iterdir():
            if not _HEX64.match(path.name) or not path.is_dir():
                continue
            try:
                origins = _read_metadata(path).get("origins", {})
            except (OSError, ValueError):
                origins = {}
            size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
            found.append(
                CacheEntry(
                    path.name,
                    path,
                    size,
                    {m: float(o.get("last_used", 0)) for m, o in origins.items()},
                    {m: str(o.get("target", "")) for m, o in origins.items()},
                )
            )
        found.sort(key=lambda e: max(e.last_used.values(), default=0.0), reverse=True)
        return found

    def remove(self, fp: str) -> None:
        """Remove one entry: renamed away first, so it disappears from the cache at once."""
        path = self.path_of(fp)
        if not path.exists():
            return
        trash = self.root / f"{_TRASH_PREFIX}{fp[:16]}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(path, trash)
        except OSError:
            trash = path
        shutil.rmtree(trash, ignore_errors=True)

    def prune(
        self,
        *,
        keep_latest: int = 1,
        keep: Iterable[str] = (),
        everything: bool = False,
        dry_run: bool = False,
    ) -> list[str]:
        """Remove old revisions; return the fingerprints removed (or that would be).

        For each served model name, the ``keep_latest`` most recently used fingerprints stay;
        an entry stays while any of its models keeps it, or when it is in ``keep``. Entries
        without a usage record stay unless ``everything``, which removes all but ``keep``.
        Temporary folders of finished or dead transfers are removed too.
        """
        if keep_latest < 0:
            raise InvalidArgument(
                f"keep_latest must be 0 or more, got {keep_latest}", field="keep_latest"
            )
        pinned = set(keep)
        entries = self.entries()
        kept: set[str] = set(pinned)
        if not everything:
            by_model: dict[str, list[tuple[float, str]]] = {}
            for e in entries:
                if not e.last_used:
                    kept.add(e.fingerprint)
                for model, used in e.last_used.items():
                    by_model.setdefault(model, []).append((used, e.fingerprint))
            for ranked in by_model.values():
                ranked.sort(reverse=True)
                kept.update(fp for _, fp in ranked[:keep_latest])
        doomed = [e.fingerprint for e in entries if e.fingerprint not in kept]
        if not dry_run:
            for fp in doomed:
                self.remove(fp)
            self._remove_stale_partials()
        return doomed

    def _remove_stale_partials(self) -> None:
        if not self.root.is_dir():
            return
        now = time.time()
        for path in self.root.iterdir():
            if path.name.startswith(_TRASH_PREFIX):
                shutil.rmtree(path, ignore_errors=True)
                continue
            if not path.name.startswith(PARTIAL_PREFIX):
                continue
            try:
                age = now - path.stat().st_mtime
            except OSError:
                continue
            pid = _partial_pid(path.name)
            gone = pid is not None and pid != os.getpid() and not _pid_alive(pid)
            if age > _ABANDONED_PARTIAL_SECONDS or (gone and age > _STALE_PARTIAL_SECONDS):
                shutil.rmtree(path, ignore_errors=True)


def _read_metadata(path: Path) -> dict[str, Any]:
    meta = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
    if not isinstance(meta, dict) or meta.get("format") != METADATA_FORMAT:
        raise ValueError(f"{path / METADATA_FILE} is not a {METADATA_FORMAT} record")
    return meta


def _write_json(path: Path, value: dict[str, Any]) -> None:
    """Write a small JSON file atomically (temporary file, then rename over)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def _partial_pid(name: str) -> int | None:
    parts = name[len(PARTIAL_PREFIX) :].split("-")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def _pid_alive(pid: int) -> bool:
    # os.kill(pid, 0) only probes on POSIX; on Windows it would terminate the process, so
    # there the age rule alone decides.
    if os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
