"""Cache keys from a server: the spec, remote computation, and the router's key strategy.

:class:`AsyncCacheKeyClient` calls ``GetCacheKeySpec`` and ``ComputeCacheKeys``;
:class:`CacheKeyClient` is its blocking face (as ``artifacts.client`` has ``pull_async`` and
``pull``) and the :class:`RemoteKeyComputer` a :class:`~tokenkeys.keys.strategy.KeyStrategy`
falls back to. :func:`strategy_from_server` is what a router calls once per served model: fetch
the spec, check its fingerprint against the one discovery advertised, run the spec's vectors
locally, and decide local or remote.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from tokenkeys._gen.openengine.v1 import cache_keys_pb2 as pb
from tokenkeys._gen.openengine.v1 import tokenizer_pb2_grpc
from tokenkeys.access.channel import PLAIN, ChannelSecurity
from tokenkeys.client.base import GrpcClient
from tokenkeys.errors import FailedPrecondition, InvalidArgument
from tokenkeys.keys import BlockKey, CacheKeySpec
from tokenkeys.keys.proto import (
    keys_from_message,
    request_to_message,
    signed_events,
    spec_from_message,
)
from tokenkeys.keys.strategy import KeyRequest, KeyStrategy

log = logging.getLogger(__name__)

T = TypeVar("T")


class AsyncCacheKeyClient(GrpcClient):
    """Calls the cache-key RPCs of one served model; gRPC errors become the tokenkeys tree.

    ``compute`` splits a large batch into calls of at most ``max_requests_per_call`` requests
    and ``max_tokens_per_call`` token ids (the server's ``--max-texts-per-request`` and
    ``--max-tokens-per-request`` must be at least these). Create it inside the event loop
    that will use it (gRPC asyncio channels belong to a loop).
    """

    def __init__(
        self,
        target: str,
        model: str = "",
        *,
        timeout: float = 30.0,
        max_requests_per_call: int = 256,
        max_tokens_per_call: int = 262_144,
        security: ChannelSecurity = PLAIN,
    ) -> None:
        if max_requests_per_call < 1 or max_tokens_per_call < 1:
            raise InvalidArgument(
                "max_requests_per_call and max_tokens_per_call must be at least 1",
                field="max_requests_per_call",
            )
        super().__init__(target, timeout=timeout, security=security)
        self.model = model
        self.max_requests_per_call = max_requests_per_call
        self.max_tokens_per_call = max_tokens_per_call
        self._channel = self.aio_channel()
        self._stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(self._channel)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncCacheKeyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def spec_message(self, *, include_vectors: bool = True) -> pb.CacheKeySpec:
        """The raw GetCacheKeySpec answer."""
        request = pb.GetCacheKeySpecRequest(model=self.model, include_vectors=include_vectors)
        return await self.call_async(self._stub.GetCacheKeySpec, request)

    async def spec(self, *, include_vectors: bool = True) -> CacheKeySpec:
        """The served spec, read from its ``spec_json`` and checked against the message."""
        return spec_from_message(await self.spec_message(include_vectors=include_vectors))

    async def compute_message(
        self, request: pb.ComputeCacheKeysRequest
    ) -> pb.ComputeCacheKeysResponse:
        """One raw ComputeCacheKeys call (``request.model`` defaults to this client's model)."""
        if not request.model:
            request.model = self.model
        return await self.call_async(self._stub.ComputeCacheKeys, request)

    async def compute(
        self, spec: CacheKeySpec, requests: Sequence[KeyRequest]
    ) -> list[list[BlockKey]]:
        """Keys of each request under ``spec``, computed by the server.

        Every call carries ``spec.fingerprint`` as ``expected_spec_fingerprint``, so keys of
        another spec are never returned: a changed deployment is FailedPrecondition.
        """
        signed = signed_events(spec)
        out: list[list[BlockKey]] = []
        for batch in self._batches(requests):
            request = pb.ComputeCacheKeysRequest(
                model=self.model,
                requests=[request_to_message(r.tokens, r.context) for r in batch],
                expected_spec_fingerprint=spec.fingerprint,
            )
            response = await self.compute_message(request)
            if len(response.results) != len(batch):
                raise FailedPrecondition(
                    f"ComputeCacheKeys answered {len(response.results)} results for "
                    f"{len(batch)} requests",
                    field="results",
                )
            if response.spec_fingerprint != spec.fingerprint:
                raise FailedPrecondition(
                    f"ComputeCacheKeys computed under spec {response.spec_fingerprint!r}, not "
                    f"{spec.fingerprint!r}",
                    field="spec_fingerprint",
                )
            out.extend(keys_from_message(r, signed=signed) for r in response.results)
        return out

    def _batches(self, requests: Sequence[KeyRequest]) -> Iterator[list[KeyRequest]]:
        batch: list[KeyRequest] = []
        tokens = 0
        for r in requests:
            n = len(r.tokens)
            full = len(batch) >= self.max_requests_per_call
            if batch and (full or tokens + n > self.max_tokens_per_call):
                yield batch
                batch, tokens = [], 0
            batch.append(r)
            tokens += n
        if batch:
            yield batch


class CacheKeyClient:
    """The blocking face of :class:`AsyncCacheKeyClient` (the CLI, a key strategy's remote).

    Its calls run on a private event loop thread, where the channel lives, so any thread may
    call, several at once (a router computes keys on worker threads). It is the
    :class:`~tokenkeys.keys.strategy.RemoteKeyComputer` a key strategy falls back to.
    Arguments are :class:`AsyncCacheKeyClient`'s.
    """

    def __init__(self, target: str, model: str = "", **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"cache-keys {target}", daemon=True
        )
        self._thread.start()
        try:
            self._client: AsyncCacheKeyClient = self._run(_open(target, model, options))
        except BaseException:
            self._stop_loop()
            raise

    @property
    def target(self) -> str:
        return self._client.target

    @property
    def model(self) -> str:
        return self._client.model

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def close(self) -> None:
        """Close the channel and end the loop thread (idempotent)."""
        if self._loop.is_closed():
            return
        self._run(self._client.close())
        self._stop_loop()

    def __enter__(self) -> CacheKeyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def spec_message(self, *, include_vectors: bool = True) -> pb.CacheKeySpec:
        """The raw GetCacheKeySpec answer."""
        return self._run(self._client.spec_message(include_vectors=include_vectors))

    def spec(self, *, include_vectors: bool = True) -> CacheKeySpec:
        """The served spec (:meth:`AsyncCacheKeyClient.spec`)."""
        return self._run(self._client.spec(include_vectors=include_vectors))

    def compute_message(self, request: pb.ComputeCacheKeysRequest) -> pb.ComputeCacheKeysResponse:
        """One raw ComputeCacheKeys call."""
        return self._run(self._client.compute_message(request))

    def compute(self, spec: CacheKeySpec, requests: Sequence[KeyRequest]) -> list[list[BlockKey]]:
        """Keys of each request under ``spec`` (:meth:`AsyncCacheKeyClient.compute`)."""
        return self._run(self._client.compute(spec, requests))


async def _open(target: str, model: str, options: dict[str, Any]) -> AsyncCacheKeyClient:
    return AsyncCacheKeyClient(target, model, **options)


def strategy_from_server(
    client: CacheKeyClient,
    *,
    expected_fingerprint: str | None = None,
    strict: bool = False,
) -> KeyStrategy:
    """The key strategy for the client's model: local when its vectors pass, else remote.

    ``expected_fingerprint`` is the spec fingerprint discovery advertised (``ModelInfo`` or a
    KV event source's ``CacheKeySpecRef``); a served spec with another fingerprint is
    FailedPrecondition, since the events or advertisement describe another deployment.
    ``strict`` refuses (Unsupported) instead of falling back to the server. The decision and
    its reason are in ``strategy.decision`` and logged.
    """
    spec = client.spec(include_vectors=True)
    if expected_fingerprint is not None and spec.fingerprint != expected_fingerprint:
        raise FailedPrecondition(
            f"the served cache-key spec of model {client.model or '(default)'} at "
            f"{client.target} has fingerprint {spec.fingerprint!r}, but "
            f"{expected_fingerprint!r} was advertised; rediscover the worker",
            field="spec_fingerprint",
            spec_fingerprint=spec.fingerprint,
        )
    strategy = KeyStrategy(spec, client, strict=strict)
    log.info(
        "cache keys for %s at %s (%s, spec %s): %s, %s",
        client.model or "(default model)",
        client.target,
        spec.profile_id,
        spec.fingerprint[:12],
        strategy.decision.mode,
        strategy.decision.reason,
    )
    return strategy
