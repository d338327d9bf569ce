"""Server side of GetTokenizerArtifacts: the manifest, then each file's chunks and its end.

Bytes come only from :attr:`TokenizerFolder.contents`, the bytes that were read, digested and
fingerprinted when the tokenizer loaded. Nothing is read from disk while streaming, so no path in
a request can reach a file outside the served folder, and a file changed on disk after loading
cannot be served under the old fingerprint.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.artifacts.manifest import (
    DEFAULT_CHUNK_SIZE,
    FORMAT,
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
)
from tokenkeys.artifacts.paths import RULES, path_problem
from tokenkeys.errors import ConfigError, InvalidArgument, NotFound
from tokenkeys.tokenizer import Tokenizer


@dataclass(frozen=True)
class StreamPlan:
    """What one request streams: the files in order, and where in the first one to start."""

    paths: tuple[str, ...]
    start_offset: int
    chunk_size: int


class ArtifactStreamer:
    """Streams one loaded tokenizer's files; attached to a served model as ``"artifacts"``.

    ``identity`` is the model's ``TokenizerIdentity`` message (everything besides the files that
    enters the fingerprint). ``max_chunk_size`` must fit the server's gRPC send limit.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        identity: pb.TokenizerIdentity,
        *,
        default_chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_chunk_size: int = MAX_CHUNK_SIZE,
    ) -> None:
        if not MIN_CHUNK_SIZE <= max_chunk_size <= MAX_CHUNK_SIZE:
            raise ConfigError(
                f"artifact max chunk size {max_chunk_size} is not within "
                f"{MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}",
                field="artifact-chunk-size",
            )
        if not MIN_CHUNK_SIZE <= default_chunk_size <= max_chunk_size:
            raise ConfigError(
                f"artifact chunk size {default_chunk_size} is not within "
                f"{MIN_CHUNK_SIZE}..{max_chunk_size} (bytes)",
                field="artifact-chunk-size",
            )
        folder = tokenizer.folder
        # Re-verify once at start what will be served: every entry has a safe path and its
        # bytes still hash to the digest that entered the fingerprint.
        for entry in folder.entries:
            problem = path_problem(entry.path)
            data = folder.contents.get(entry.path)
            if problem or data is None or len(data) != entry.size:
                raise ConfigError(
                    f"{folder.root}: cannot serve {entry.path!r} as an artifact "
                    f"({problem or 'its bytes are not the ones fingerprinted'})",
                    field="model",
                )
            if hashlib.sha256(data).hexdigest() != entry.sha256:
                raise ConfigError(
                    f"{folder.root / entry.path}: bytes changed since fingerprinting",
                    field="model",
                )
        self._entries = {e.path: e for e in folder.entries}
        self._contents = {e.path: folder.contents[e.path] for e in folder.entries}
        self._default_chunk = default_chunk_size
        self._max_chunk = max_chunk_size
        self._manifest_base = pb.ArtifactManifest(
            fingerprint=tokenizer.fingerprint,
            files=[
                pb.ArtifactFile(path=e.path, size=e.size, sha256=e.sha256) for e in folder.entries
            ],
            format=FORMAT,
            identity=identity,
        )

    @property
    def paths(self) -> tuple[str, ...]:
        """Every servable path, sorted."""
        return tuple(self._entries)

    def plan(self, request: pb.GetTokenizerArtifactsRequest) -> StreamPlan:
        """Check a request and say what it streams; raise InvalidArgument or NotFound."""
        chunk = request.chunk_size if request.HasField("chunk_size") else self._default_chunk
        if not MIN_CHUNK_SIZE <= chunk <= self._max_chunk:
            raise InvalidArgument(
                f"chunk_size {chunk} is not within {MIN_CHUNK_SIZE}..{self._max_chunk} bytes "
                "(below the gRPC message limit); leave it unset for the server default "
                f"({self._default_chunk})",
                field="chunk_size",
            )
        wanted = list(request.paths)
        for i, path in enumerate(wanted):
            problem = path_problem(path)
            if problem:
                raise InvalidArgument(
                    f"paths[{i}] {path!r} {problem}; {RULES}", field="paths", index=i
                )
            if path not in self._entries:
                raise NotFound(
                    f"paths[{i}] {path!r} is not a file of this tokenizer; its files are "
                    f"{', '.join(self._entries)}",
                    field="paths",
                    index=i,
                )
        if len(set(wanted)) != len(wanted):
            raise InvalidArgument(f"paths {wanted} name a file twice", field="paths")
        paths = sorted(wanted) if wanted else list(self._entries)
        start = 0
        if request.HasField("resume"):
            resume = request.resume
            if resume.path not in paths:
                raise InvalidArgument(
                    f"resume.path {resume.path!r} is not one of the streamed files "
                    f"({', '.join(paths)})",
                    field="resume.path",
                )
            size = self._entries[resume.path].size
            if resume.offset > size:
                raise InvalidArgument(
                    f"resume.offset {resume.offset} is past the end of {resume.path!r} "
                    f"({size} bytes)",
                    field="resume.offset",
                )
            paths = paths[paths.index(resume.path) :]
            start = resume.offset
        return StreamPlan(tuple(paths), start, chunk)

    def manifest(self, plan: StreamPlan) -> pb.ArtifactManifest:
        """The manifest message that opens a stream following ``plan``."""
        message = pb.ArtifactManifest()
        message.CopyFrom(self._manifest_base)
        message.streamed_paths.extend(plan.paths)
        message.start_offset = plan.start_offset
        message.chunk_size = plan.chunk_size
        message.total_size = sum(self._entries[p].size for p in plan.paths) - plan.start_offset
        return message

    async def stream(
        self, request: pb.GetTokenizerArtifactsRequest, context: object = None
    ) -> AsyncIterator[pb.TokenizerArtifactChunk]:
        """The whole stream for one request (the servicer checks ``expected_fingerprint``)."""
        plan = self.plan(request)
        yield pb.TokenizerArtifactChunk(manifest=self.manifest(plan))
        offset = plan.start_offset
        for path in plan.paths:
            entry = self._entries[path]
            data = self._contents[path]
            for start in range(offset, entry.size, plan.chunk_size):
                yield pb.TokenizerArtifactChunk(
                    data=pb.ArtifactData(
                        path=path, offset=start, data=data[start : start + plan.chunk_size]
                    )
                )
            yield pb.TokenizerArtifactChunk(
                file_end=pb.ArtifactFileEnd(path=path, size=entry.size, sha256=entry.sha256)
            )
            offset = 0
