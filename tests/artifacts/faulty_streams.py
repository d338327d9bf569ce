"""A deliberately faulty artifact streamer for tests, and helpers to serve and inspect pulls.

:class:`FaultyStreamer` wraps the real :class:`ArtifactStreamer` and rewrites its stream with a
*mutation*: a function from the real list of messages to the list to send, where a message may
be replaced by :class:`Stall` (sleep) or :class:`Abort` (end the call with a status). It is
attached to a served model in place of the real streamer, so faults travel through the real
servicer, the real gRPC server and the real client.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.artifacts import ArtifactStreamer
from tokenkeys.artifacts.manifest import options_from_identity
from tokenkeys.limits import Limits
from tokenkeys.preprocess import Preprocessor
from tokenkeys.serving.models import ModelRegistry, ServedModel
from tokenkeys.tokenizer import FileEntry, Tokenizer, fingerprint
from tokenkeys.tokenizer.proto import tokenizer_identity


@dataclass(frozen=True)
class Stall:
    seconds: float


@dataclass(frozen=True)
class Abort:
    code: grpc.StatusCode
    details: str


Message = pb.TokenizerArtifactChunk | Stall | Abort
Mutation = Callable[[list[pb.TokenizerArtifactChunk], int], list[Message]]


class FaultyStreamer:
    """The real stream, rewritten by ``mutation(messages, call_number)``; counts calls."""

    def __init__(self, real: ArtifactStreamer, mutation: Mutation) -> None:
        self.real = real
        self.mutation = mutation
        self.calls = 0
        self.requests: list[pb.GetTokenizerArtifactsRequest] = []

    async def stream(self, request: pb.GetTokenizerArtifactsRequest, context: object):  # noqa: ANN201
        self.calls += 1
        self.requests.append(copy.deepcopy(request))
        real = [m async for m in self.real.stream(request, context)]
        for message in self.mutation(real, self.calls):
            if isinstance(message, Stall):
                await asyncio.sleep(message.seconds)
            elif isinstance(message, Abort):
                await context.abort(message.code, message.details)  # type: ignore[attr-defined]
            else:
                yield message


def identity(messages: list[pb.TokenizerArtifactChunk], call: int) -> list[Message]:
    return list(messages)


def served(tokenizer: Tokenizer, mutation: Mutation | None = None, name: str = "tok"):  # noqa: ANN201
    """A registry serving ``tokenizer`` under ``name``; with the streamer faulty if asked."""
    real = ArtifactStreamer(tokenizer, tokenizer_identity(tokenizer))
    streamer = real if mutation is None else FaultyStreamer(real, mutation)
    model = ServedModel(name, tokenizer, Preprocessor(tokenizer, Limits()), artifacts=streamer)
    registry = ModelRegistry()
    registry.add(model)
    return registry, streamer


def data_indices(messages: list[pb.TokenizerArtifactChunk], path: str | None = None) -> list[int]:
    """Indices of the data messages (of one file when ``path`` is given)."""
    return [
        i
        for i, m in enumerate(messages)
        if m.WhichOneof("kind") == "data" and (path is None or m.data.path == path)
    ]


def end_index(messages: list[pb.TokenizerArtifactChunk], path: str) -> int:
    return next(
        i
        for i, m in enumerate(messages)
        if m.WhichOneof("kind") == "file_end" and m.file_end.path == path
    )


def consistent_manifest(manifest: pb.ArtifactManifest) -> None:
    """Recompute the manifest's fingerprint from its (edited) files, so only the edit is wrong."""
    options, behaviour = options_from_identity(manifest.identity)
    entries = [FileEntry(f.path, f.size, f.sha256) for f in manifest.files]
    manifest.fingerprint = fingerprint(entries, options, behaviour)


def leftovers(cache: Path) -> list[str]:
    """Everything inside the cache folder (entries, partial folders, files)."""
    if not cache.exists():
        return []
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))
