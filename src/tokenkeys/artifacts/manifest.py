"""The artifact manifest as a checked value, and the limits a client holds a transfer to.

:meth:`Manifest.from_proto` is the client's first line of defence: it refuses a manifest that
breaks any rule (unsafe or unknown path, malformed digest, a file over the size cap, a
fingerprint that does not follow from the files and identity) before a single byte is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.artifacts.faults import fault
from tokenkeys.artifacts.paths import RULES, path_problem
from tokenkeys.errors import ConfigError, LimitExceeded, TokenkeysError
from tokenkeys.tokenizer import TOKENIZER_FILES, FileEntry, TokenizerOptions, fingerprint
from tokenkeys.tokenizer.folder import REQUIRED_FILES
from tokenkeys.tokenizer.proto import identity_options

FORMAT = "huggingface"

# gRPC refuses messages over 4 MiB by default (grpc.max_receive_message_length); a data chunk
# leaves 64 KiB for its path, offset and framing so any stock client can receive it.
MAX_CHUNK_SIZE = 4 * 1024 * 1024 - 64 * 1024
MIN_CHUNK_SIZE = 1024
# Measured over loopback (bench/bench_artifacts.py): 256 KiB to 1 MiB chunks pull fastest,
# 512 KiB best; from 2 MiB on each message costs more than it saves.
DEFAULT_CHUNK_SIZE = 512 * 1024

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ArtifactLimits:
    """What a client accepts from a server: caps on one file and on a whole tokenizer, in bytes.

    Checked against the manifest before anything is written, so an oversized transfer costs
    nothing. The defaults are far above real tokenizers (the largest common tokenizer.json files
    are tens of MiB).
    """

    max_file_bytes: int = 256 * 1024 * 1024
    max_total_bytes: int = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_total_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"{name} must be at least 1 byte, got {getattr(self, name)}", field=name
                )


@dataclass(frozen=True)
class Manifest:
    """A validated ``ArtifactManifest``: files, identity, and what this stream carries."""

    fingerprint: str
    files: tuple[FileEntry, ...]
    options: TokenizerOptions
    behaviour: str
    streamed_paths: tuple[str, ...]
    start_offset: int
    chunk_size: int

    @property
    def tokenizer_size(self) -> int:
        """Size of every file of the tokenizer, in bytes."""
        return sum(e.size for e in self.files)

    @property
    def stream_size(self) -> int:
        """Data bytes this stream carries."""
        return sum(self.entry(p).size for p in self.streamed_paths) - self.start_offset

    def entry(self, path: str) -> FileEntry:
        """The manifest entry of ``path`` (which must be listed)."""
        for e in self.files:
            if e.path == path:
                return e
        raise KeyError(path)

    @classmethod
    def from_proto(
        cls,
        message: pb.ArtifactManifest,
        limits: ArtifactLimits,
        expected_fingerprint: str | None = None,
    ) -> Manifest:
        """Check every rule and return the manifest; raise naming the first broken rule.

        Path rules come first (so a traversal attempt is reported as such), then the file
        list, the size caps (:class:`LimitExceeded`), the stream description and finally the
        fingerprint, recomputed from the files and identity.
        """
        _check_paths(message)
        entries = _checked_files(message, limits)
        streamed = _checked_stream(message, entries)
        options, behaviour = options_from_identity(message.identity)
        _check_fingerprint(message, entries, options, behaviour, expected_fingerprint)
        return cls(
            fingerprint=message.fingerprint,
            files=entries,
            options=options,
            behaviour=behaviour,
            streamed_paths=streamed,
            start_offset=message.start_offset,
            chunk_size=message.chunk_size,
        )


def _check_paths(message: pb.ArtifactManifest) -> None:
    """Every listed and streamed path is safe (a traversal attempt is reported as such)."""
    for path in [f.path for f in message.files] + list(message.streamed_paths):
        problem = path_problem(path)
        if problem:
            raise fault(repr(path), "unsafe-path", f"refused: the path {problem}; {RULES}")


def _checked_files(message: pb.ArtifactManifest, limits: ArtifactLimits) -> tuple[FileEntry, ...]:
    """The file list: format, known names, sorted and unique, required ones, digests, caps."""
    if message.format != FORMAT:
        raise fault(
            "manifest",
            "bad-manifest",
            f"format {message.format!r} is not {FORMAT!r}, the only one this client reads",
        )
    files = list(message.files)
    paths = [f.path for f in files]
    for p in paths:
        if p not in TOKENIZER_FILES:
            raise fault(
                p,
                "unknown-file",
                f"not a tokenizer file this client knows ({', '.join(TOKENIZER_FILES)}); "
                "a newer server may serve files this version cannot load: upgrade tokenkeys",
            )
    if paths != sorted(set(paths)):
        raise fault("manifest", "bad-manifest", f"files are not sorted and unique: {paths}")
    for required in REQUIRED_FILES:
        if required not in paths:
            raise fault(required, "bad-manifest", "missing from the manifest; it is required")
    for f in files:
        if not _HEX64.match(f.sha256):
            raise fault(
                f.path,
                "bad-manifest",
                f"sha256 {f.sha256!r} is not 64 lowercase hex characters",
            )
        if f.size > limits.max_file_bytes:
            raise LimitExceeded(
                f"{f.path}: {f.size} bytes is over the per-file cap of "
                f"{limits.max_file_bytes} bytes (max_file_bytes); nothing was written; "
                "raise the cap if this server is trusted",
                field=f.path,
                limit=limits.max_file_bytes,
            )
    total = sum(f.size for f in files)
    if total > limits.max_total_bytes:
        raise LimitExceeded(
            f"manifest: {total} bytes in {len(files)} files is over the total cap of "
            f"{limits.max_total_bytes} bytes (max_total_bytes); nothing was written",
            field="manifest",
            limit=limits.max_total_bytes,
        )
    return tuple(FileEntry(f.path, f.size, f.sha256) for f in files)


def _checked_stream(
    message: pb.ArtifactManifest, entries: tuple[FileEntry, ...]
) -> tuple[str, ...]:
    """What this stream carries: streamed paths, start offset, chunk size, total size."""
    sizes = {e.path: e.size for e in entries}
    streamed = tuple(message.streamed_paths)
    if any(p not in sizes for p in streamed) or list(streamed) != sorted(set(streamed)):
        raise fault(
            "manifest",
            "bad-manifest",
            f"streamed_paths {list(streamed)} are not a sorted, unique subset of the files",
        )
    if message.start_offset and (not streamed or message.start_offset > sizes[streamed[0]]):
        raise fault(
            "manifest",
            "bad-manifest",
            f"start_offset {message.start_offset} is past the first streamed file",
        )
    if not 1 <= message.chunk_size <= MAX_CHUNK_SIZE:
        raise fault(
            "manifest",
            "bad-manifest",
            f"chunk_size {message.chunk_size} is not within 1..{MAX_CHUNK_SIZE}",
        )
    stream_size = sum(sizes[p] for p in streamed) - message.start_offset
    if message.total_size != stream_size:
        raise fault(
            "manifest",
            "bad-manifest",
            f"total_size {message.total_size} is not the {stream_size} bytes of the streamed files",
        )
    return streamed


def _check_fingerprint(
    message: pb.ArtifactManifest,
    entries: tuple[FileEntry, ...],
    options: TokenizerOptions,
    behaviour: str,
    expected: str | None,
) -> None:
    """The advertised fingerprint follows from the files and identity, and is the one asked."""
    if not _HEX64.match(message.fingerprint):
        raise fault(
            "manifest",
            "bad-manifest",
            f"fingerprint {message.fingerprint!r} is not 64 lowercase hex characters",
        )
    recomputed = fingerprint(entries, options, behaviour)
    if recomputed != message.fingerprint:
        raise fault(
            "manifest",
            "fingerprint-mismatch",
            f"the files and identity give fingerprint {recomputed}, but the manifest "
            f"advertises {message.fingerprint}; the server's manifest is inconsistent",
        )
    if expected is not None and message.fingerprint != expected:
        raise fault(
            "manifest",
            "fingerprint-mismatch",
            f"the stream carries fingerprint {message.fingerprint}, but {expected} was asked for",
        )


def options_from_identity(identity: pb.TokenizerIdentity) -> tuple[TokenizerOptions, str]:
    """The behaviour options and behaviour string a manifest's ``TokenizerIdentity`` describes.

    :func:`tokenkeys.tokenizer.proto.identity_options`, its problems reported as a bad manifest.
    """
    try:
        return identity_options(identity)
    except TokenkeysError as exc:
        raise fault("manifest", "bad-manifest", exc.message) from exc
