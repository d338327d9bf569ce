"""Receiving one artifact stream into a temporary folder and installing it only once verified.

:class:`Receiver` is transport-free: it is fed the stream's messages one by one (by
:mod:`tokenkeys.artifacts.client`, or by a test) and enforces every rule as they arrive:

- the manifest comes first and passes :meth:`Manifest.from_proto` before anything is written;
- each file's data arrives in order with contiguous offsets, no chunk empty or over the
  manifest's chunk size, never past the file's size;
- each file end repeats the manifest's size and digest, and the bytes received hash to it;
- after the last file the fingerprint is recomputed from what was received and compared;
- only then is the folder renamed into ``<cache>/<fingerprint>/``.

Any failure, cancellation or interrupt (the receiver is a context manager) removes the temporary
folder, so a refused transfer leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.artifacts.cache import ArtifactCache, Installed
from tokenkeys.artifacts.faults import fault
from tokenkeys.artifacts.manifest import ArtifactLimits, Manifest
from tokenkeys.tokenizer import FileEntry, fingerprint

_OPEN_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)  # never write through a link
    | getattr(os, "O_BINARY", 0)
)


@dataclass
class _File:
    """The file being received: its manifest entry, descriptor, running digest and length."""

    entry: FileEntry
    fd: int
    digest: Any  # a hashlib sha256 object
    written: int = 0


class Receiver:
    """One verified transfer into ``cache``; use as a context manager, then :meth:`install`.

    ``expected_fingerprint`` (when known) must be the manifest's; ``origin`` is the
    ``(model, target)`` recorded in the cache for pruning.
    """

    def __init__(
        self,
        cache: ArtifactCache,
        *,
        limits: ArtifactLimits | None = None,
        expected_fingerprint: str | None = None,
        origin: tuple[str, str] | None = None,
    ) -> None:
        self.cache = cache
        self.limits = limits or ArtifactLimits()
        self.expected = expected_fingerprint
        self.origin = origin
        self.manifest: Manifest | None = None
        self.received = 0
        self._partial: Path | None = None
        self._next = 0  # index in manifest.files of the next file to open
        self._current: _File | None = None
        self._done: list[FileEntry] = []

    # -- context management: any exit but a successful install removes the partial folder --

    def __enter__(self) -> Receiver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()

    def abort(self) -> None:
        """Close and remove whatever was written; idempotent."""
        if self._current is not None:
            os.close(self._current.fd)
            self._current = None
        if self._partial is not None:
            self.cache.discard(self._partial)
            self._partial = None

    # -- where the transfer stands --

    @property
    def complete(self) -> bool:
        """True when every file was received and closed."""
        return self.manifest is not None and len(self._done) == len(self.manifest.files)

    def resume_point(self) -> tuple[str, int] | None:
        """The (path, offset) to resume from, or None before the manifest or when complete."""
        if self.manifest is None or self.complete:
            return None
        if self._current is not None:
            return self._current.entry.path, self._current.written
        return self.manifest.files[self._next].path, 0

    def position(self) -> str:
        """Where the transfer stands, for error messages."""
        if self.manifest is None:
            return "before the manifest"
        point = self.resume_point()
        if point is None:
            return "after the last file"
        path, offset = point
        return f"{path} at byte {offset} of {self.manifest.entry(path).size}"

    @property
    def current_path(self) -> str:
        """The file being received (or due next), ``manifest`` before it arrived."""
        point = self.resume_point()
        return point[0] if point else "manifest"

    # -- the stream --

    def feed(self, chunk: pb.TokenizerArtifactChunk) -> int:
        """Apply one stream message; return the number of file bytes it carried."""
        kind = chunk.WhichOneof("kind")
        if kind == "manifest":
            self._on_manifest(chunk.manifest)
            return 0
        if self.manifest is None:
            raise fault("manifest", "no-manifest", f"the stream opened with {kind or 'nothing'}")
        if self.complete:
            raise fault("manifest", "trailing-data", f"got {kind} after the last file was complete")
        if kind == "data":
            return self._on_data(chunk.data)
        if kind == "file_end":
            self._on_file_end(chunk.file_end)
            return 0
        raise fault(self.current_path, "bad-manifest", "a stream message of unknown kind")

    def _on_manifest(self, message: pb.ArtifactManifest) -> None:
        manifest = Manifest.from_proto(message, self.limits, self.expected)
        if self.manifest is None:
            everything = tuple(e.path for e in manifest.files)
            if manifest.streamed_paths != everything or manifest.start_offset:
                raise fault(
                    "manifest",
                    "bad-manifest",
                    f"the stream carries {list(manifest.streamed_paths)} from byte "
                    f"{manifest.start_offset}, not every file from the start, so it cannot be "
                    "installed",
                )
            self.manifest = manifest
            self.expected = manifest.fingerprint
            self._partial = self.cache.new_partial(manifest.fingerprint)
            return
        # A resumed stream: the same tokenizer, continuing exactly where this one stopped.
        point = self.resume_point()
        remaining = tuple(e.path for e in self.manifest.files[len(self._done) :])
        if (
            manifest.files != self.manifest.files
            or point is None
            or manifest.streamed_paths != remaining
            or manifest.start_offset != point[1]
        ):
            raise fault(
                "manifest",
                "resume-mismatch",
                f"the resumed stream starts at {list(manifest.streamed_paths)[:1]} byte "
                f"{manifest.start_offset}, but this transfer stands at {self.position()}",
            )
        self.manifest = manifest

    def _open_next(self, path: str, kind: str) -> _File:
        assert self.manifest is not None and self._partial is not None
        due = self.manifest.files[self._next]
        if path != due.path:
            raise fault(
                path,
                "unexpected-file",
                f"got {kind} for this file while {due.path!r} is due next (files arrive in "
                "manifest order)",
            )
        target = self._partial / due.path
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, _OPEN_FLAGS, 0o644)
        self._current = _File(due, fd, hashlib.sha256())
        self._next += 1
        return self._current

    def _on_data(self, data: pb.ArtifactData) -> int:
        assert self.manifest is not None
        current = self._current
        if current is None:
            current = self._open_next(data.path, "data")
        elif data.path != current.entry.path:
            raise fault(
                data.path,
                "unexpected-file",
                f"got data for this file while {current.entry.path!r} is not complete "
                f"({current.written} of {current.entry.size} bytes)",
            )
        path, size = current.entry.path, current.entry.size
        if data.offset > current.written:
            raise fault(
                path,
                "offset-gap",
                f"chunk at offset {data.offset}, but {current.written} bytes were received: "
                "a chunk is missing or out of order",
            )
        if data.offset < current.written:
            raise fault(
                path,
                "offset-overlap",
                f"chunk at offset {data.offset} overlaps the {current.written} bytes already "
                "received",
            )
        payload = data.data  # one read: each field access may copy the bytes
        n = len(payload)
        if n == 0 or n > self.manifest.chunk_size:
            raise fault(
                path,
                "oversized-chunk",
                f"chunk of {n} bytes at offset {data.offset}; chunks hold 1.."
                f"{self.manifest.chunk_size} bytes",
            )
        if current.written + n > size:
            raise fault(
                path,
                "size-mismatch",
                f"chunk at offset {data.offset} of {n} bytes runs past the file's size of "
                f"{size} bytes in the manifest",
            )
        view = memoryview(payload)
        while view:
            view = view[os.write(current.fd, view) :]
        current.digest.update(payload)
        current.written += n
        self.received += n
        return n

    def _on_file_end(self, end: pb.ArtifactFileEnd) -> None:
        current = self._current or self._open_next(end.path, "file_end")
        entry = current.entry
        if end.path != entry.path:
            raise fault(
                end.path,
                "unexpected-file",
                f"file end for this file while {entry.path!r} is not complete",
            )
        if end.size != entry.size:
            raise fault(
                entry.path,
                "size-mismatch",
                f"file end says {end.size} bytes, the manifest {entry.size}",
            )
        if current.written != entry.size:
            raise fault(
                entry.path,
                "truncated" if current.written < entry.size else "size-mismatch",
                f"file end after {current.written} of {entry.size} bytes: data is missing",
            )
        if end.sha256 != entry.sha256:
            raise fault(
                entry.path,
                "digest-mismatch",
                f"file end says sha256 {end.sha256}, the manifest {entry.sha256}",
            )
        actual = current.digest.hexdigest()
        if actual != entry.sha256:
            raise fault(
                entry.path,
                "corrupt",
                f"the {entry.size} bytes received hash to {actual}, not {entry.sha256}: "
                "corrupted in transit",
            )
        # No fsync: a cache entry is re-verified against its fingerprint on every lookup, so a
        # copy torn by a power loss is detected and pulled again; syncing would only add cost.
        os.close(current.fd)
        self._current = None
        self._done.append(FileEntry(entry.path, current.written, actual))

    def install(self) -> Installed:
        """Check the transfer is complete, recompute the fingerprint, rename into the cache."""
        if self.manifest is None:
            raise fault("manifest", "no-manifest", "the stream ended before its manifest")
        if not self.complete:
            raise fault(
                self.current_path,
                "truncated",
                f"the stream ended at {self.position()}: data is missing",
            )
        manifest = self.manifest
        recomputed = fingerprint(self._done, manifest.options, manifest.behaviour)
        if recomputed != manifest.fingerprint:
            raise fault(
                "manifest",
                "fingerprint-mismatch",
                f"the received files give fingerprint {recomputed}, not {manifest.fingerprint}",
            )
        assert self._partial is not None
        path = self.cache.commit(
            self._partial,
            manifest.fingerprint,
            self._done,
            manifest.options,
            manifest.behaviour,
            self.origin,
        )
        self._partial = None
        return Installed(
            manifest.fingerprint, path, manifest.options, manifest.behaviour, self.received
        )
