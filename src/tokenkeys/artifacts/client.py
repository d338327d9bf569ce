"""Pulling a served tokenizer over gRPC into the local cache: one asyncio core, a blocking face.

``pull_async`` / ``fetch_async`` are the implementation; ``pull`` / ``fetch`` run them with
:func:`asyncio.run` for blocking callers (the CLI). Flow of one pull:

1. Learn the served fingerprint (``GetTokenizerInfo``) unless the caller names one.
2. A verified cache entry for it ends the pull: nothing is transferred.
3. Otherwise stream ``GetTokenizerArtifacts`` with ``expected_fingerprint`` set, so a server
   that changed revision in between answers FAILED_PRECONDITION instead of other bytes, into a
   :class:`~tokenkeys.artifacts.install.Receiver`, which verifies and installs.
4. A connection lost mid-stream (UNAVAILABLE) is resumed from the last byte received, a few
   times; every other failure, the deadline and cancellation remove the partial folder and
   raise an error naming the file, the offset and the fault.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import grpc

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys._gen.openengine.v1 import tokenizer_pb2_grpc
from tokenkeys.access.channel import PLAIN, ChannelSecurity
from tokenkeys.artifacts.cache import ArtifactCache, Installed
from tokenkeys.artifacts.install import Receiver
from tokenkeys.artifacts.manifest import ArtifactLimits
from tokenkeys.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    TokenkeysError,
    Unavailable,
    from_grpc,
)
from tokenkeys.limits import MAX_ANSWER_BYTES
from tokenkeys.tokenizer import Tokenizer

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class PullSettings:
    """How a pull behaves; the defaults suit a router pulling from a nearby engine.

    - ``chunk_size``: bytes per chunk to ask for; None: the server default.
    - ``limits``: per-file and total size caps, checked on the manifest.
    - ``timeout``: seconds for the whole pull (info, stream and resumes); None: no deadline.
    - ``resume_attempts``: how many times a stream cut by a lost connection is resumed from its
      last byte before giving up; ``resume_backoff`` seconds grow linearly between them.
    - ``receive_window``: bytes the server may send ahead of what this client has consumed
      (the HTTP/2 stream window). gRPC's 64 KiB default costs round trips on a fresh
      connection; 8 MiB lets a whole typical tokenizer flow at once (bench_artifacts.py).
    - ``security``: TLS and bearer token of the channel (default: plain, no token).
    """

    chunk_size: int | None = None
    limits: ArtifactLimits = field(default_factory=ArtifactLimits)
    timeout: float | None = None
    resume_attempts: int = 2
    resume_backoff: float = 0.2
    receive_window: int = 8 * 1024 * 1024
    security: ChannelSecurity = PLAIN

    def channel_options(self) -> list[tuple[str, int]]:
        """gRPC channel arguments for a pull."""
        return [
            ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
            ("grpc.http2.lookahead_bytes", self.receive_window),
            # A fixed window: BDP probing would resize it behind the setting's back.
            ("grpc.http2.bdp_probe", 0),
        ]


@dataclass(frozen=True)
class Progress:
    """Bytes received so far out of ``total``, reported after each chunk of file ``path``."""

    path: str
    done: int
    total: int


ProgressCallback = Callable[[Progress], None]


async def fetch_async(
    target: str,
    *,
    model: str = "",
    fingerprint: str | None = None,
    cache: ArtifactCache | str | os.PathLike[str] | None = None,
    settings: PullSettings | None = None,
    progress: ProgressCallback | None = None,
) -> Installed:
    """Make sure the tokenizer served at ``target`` is in the cache, verified; return it.

    ``model`` picks a served model (empty: the server's default). ``fingerprint`` pins a
    revision: a cached one costs no call at all, and a server serving another one answers
    FAILED_PRECONDITION. ``cache`` is an :class:`ArtifactCache` or its folder (default:
    :func:`~tokenkeys.artifacts.cache.default_cache_dir`).
    """
    settings = settings or PullSettings()
    store = cache if isinstance(cache, ArtifactCache) else ArtifactCache(cache)
    loop = asyncio.get_running_loop()
    deadline = None if settings.timeout is None else loop.time() + settings.timeout

    def remaining() -> float | None:
        if deadline is None:
            return None
        left = deadline - loop.time()
        if left <= 0:
            raise DeadlineExceeded(
                f"the pull's {settings.timeout} s deadline passed",
                field="timeout",
                grpc_code="DEADLINE_EXCEEDED",
            )
        return left

    if fingerprint is not None:
        hit = store.lookup(fingerprint)
        if hit is not None:
            if model:
                store.touch(fingerprint, model, target)
            return hit
    async with settings.security.aio_channel(target, settings.channel_options()) as channel:
        stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
        served = model
        if fingerprint is None:
            try:
                info = await stub.GetTokenizerInfo(
                    pb.GetTokenizerInfoRequest(model=model), timeout=remaining()
                )
            except grpc.RpcError as exc:
                error = from_grpc(exc)
                raise type(error)(f"{target}: {error.message}", **error.details) from exc
            fingerprint, served = info.fingerprint, info.model
            hit = store.lookup(fingerprint)
            if hit is not None:
                store.touch(fingerprint, served, target)
                return hit
        origin = (served, target) if served else None
        try:
            with Receiver(
                store, limits=settings.limits, expected_fingerprint=fingerprint, origin=origin
            ) as receiver:
                await _receive(stub, target, served, receiver, settings, remaining, progress)
                return receiver.install()
        except OSError as exc:
            raise FailedPrecondition(
                f"{store.root}: cannot write the tokenizer cache ({exc}); free space or choose "
                "another cache folder (--cache, $TOKENKEYS_CACHE)",
                field="cache",
            ) from exc


async def _receive(
    stub: tokenizer_pb2_grpc.OpenEngineTokenizerStub,
    target: str,
    model: str,
    receiver: Receiver,
    settings: PullSettings,
    remaining: Callable[[], float | None],
    progress: ProgressCallback | None,
) -> None:
    """Feed the stream (resumed after lost connections) into ``receiver`` until it ends."""
    attempts = 0
    while True:
        request = pb.GetTokenizerArtifactsRequest(model=model)
        if receiver.expected is not None:
            request.expected_fingerprint = receiver.expected
        if settings.chunk_size is not None:
            request.chunk_size = settings.chunk_size
        point = receiver.resume_point()
        if point is not None:
            request.resume.path, request.resume.offset = point
        try:
            timeout = remaining()
        except DeadlineExceeded as error:
            raise _in_context(error, target, receiver, attempts) from None
        call = stub.GetTokenizerArtifacts(request, timeout=timeout)
        try:
            async for chunk in call:
                if receiver.feed(chunk) and progress is not None:
                    assert receiver.manifest is not None
                    progress(
                        Progress(
                            chunk.data.path, receiver.received, receiver.manifest.tokenizer_size
                        )
                    )
            return
        except grpc.RpcError as exc:
            error = from_grpc(exc)
            if (
                isinstance(error, Unavailable)
                and receiver.manifest is not None
                and attempts < settings.resume_attempts
            ):
                attempts += 1
                await asyncio.sleep(settings.resume_backoff * attempts)
                continue
            raise _in_context(error, target, receiver, attempts) from exc
        except asyncio.CancelledError:
            # Stay a CancelledError (asyncio.timeout and task groups rely on it), but say where.
            raise asyncio.CancelledError(
                f"{target}: pull cancelled at {receiver.position()}; nothing was installed"
            ) from None
        finally:
            call.cancel()


def _in_context(
    error: TokenkeysError, target: str, receiver: Receiver, attempts: int
) -> TokenkeysError:
    """The same kind of error, saying which file and byte the transfer stopped at."""
    code = str(error.details.get("grpc_code", type(error).__name__)).lower()
    where = "" if receiver.manifest is None else f"transfer stopped at {receiver.position()}: "
    retried = f" (after {attempts} resume attempts)" if attempts else ""
    details = {k: v for k, v in error.details.items() if k != "fault"}
    return type(error)(
        f"{target}: {where}{error.message}{retried}; nothing was installed",
        field=receiver.current_path,
        fault=code,
        **details,
    )


async def pull_async(
    target: str,
    *,
    model: str = "",
    fingerprint: str | None = None,
    cache: ArtifactCache | str | os.PathLike[str] | None = None,
    settings: PullSettings | None = None,
    progress: ProgressCallback | None = None,
) -> Tokenizer:
    """:func:`fetch_async`, then load the cached tokenizer; its fingerprint is the server's."""
    installed = await fetch_async(
        target,
        model=model,
        fingerprint=fingerprint,
        cache=cache,
        settings=settings,
        progress=progress,
    )
    return await asyncio.to_thread(installed.load)


def _blocking(coro: Callable[P, Coroutine[Any, Any, T]], doc: str) -> Callable[P, T]:
    """The blocking face of one ``*_async`` entry point: same signature, run on a fresh loop."""

    @functools.wraps(coro)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return asyncio.run(coro(*args, **kwargs))

    run.__name__ = run.__qualname__ = coro.__name__.removesuffix("_async")
    run.__doc__ = doc
    return run


fetch = _blocking(
    fetch_async, "Blocking :func:`fetch_async` (not from inside a running event loop)."
)
pull = _blocking(
    pull_async, "Blocking :func:`pull_async`: the server's tokenizer, verified, cached and loaded."
)
