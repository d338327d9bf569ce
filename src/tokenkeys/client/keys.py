"""Cache keys from a server: the spec, remote computation, and the router's key strategy.

:class:`AsyncCacheKeyClient` calls ``GetCacheKeySpec`` and ``ComputeCacheKeys`` from an event
loop; :class:`CacheKeyClient` is its blocking face (as ``artifacts.client`` has ``pull_async``
and ``pull``), the same requests and checks over a blocking channel, and the
:class:`RemoteKeyComputer` a :class:`~tokenkeys.keys.strategy.KeyStrategy` falls back to.
:func:`strategy_from_server` is what a router calls once per served model: fetch the spec, check
its fingerprint against the one discovery advertised, run the spec's vectors locally, and
decide local or remote.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

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


class _CacheKeyCalls(GrpcClient):
    """What both faces share: the model, the batch bounds, the requests and their checks.

    ``compute`` splits a large batch into calls of at most ``max_requests_per_call`` requests
    and ``max_tokens_per_call`` token ids (the server's ``--max-texts-per-request`` and
    ``--max-tokens-per-request`` must be at least these). Every call carries
    ``spec.fingerprint`` as ``expected_spec_fingerprint``, so keys of another spec are never
    returned: a changed deployment is FailedPrecondition.
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

    def _spec_request(self, include_vectors: bool) -> pb.GetCacheKeySpecRequest:
        return pb.GetCacheKeySpecRequest(model=self.model, include_vectors=include_vectors)

    def _compute_requests(
        self, spec: CacheKeySpec, requests: Sequence[KeyRequest]
    ) -> Iterator[tuple[list[KeyRequest], pb.ComputeCacheKeysRequest]]:
        """Each batch and its ComputeCacheKeys request."""
        for batch in self._batches(requests):
            yield (
                batch,
                pb.ComputeCacheKeysRequest(
                    model=self.model,
                    requests=[request_to_message(r.tokens, r.context) for r in batch],
                    expected_spec_fingerprint=spec.fingerprint,
                ),
            )

    @staticmethod
    def _keys_of(
        spec: CacheKeySpec, batch: list[KeyRequest], response: pb.ComputeCacheKeysResponse
    ) -> list[list[BlockKey]]:
        """The keys of one answered batch, once the answer is checked against the request."""
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
        signed = signed_events(spec)
        return [keys_from_message(r, signed=signed) for r in response.results]

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


class AsyncCacheKeyClient(_CacheKeyCalls):
    """The cache-key RPCs of one served model, from an event loop (see :class:`_CacheKeyCalls`).

    Create it inside the event loop that will use it (gRPC asyncio channels belong to a loop).
    """

    def __init__(self, target: str, model: str = "", **options: Any) -> None:
        super().__init__(target, model, **options)
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
        request = self._spec_request(include_vectors)
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
        """Keys of each request under ``spec``, computed by the server."""
        out: list[list[BlockKey]] = []
        for batch, request in self._compute_requests(spec, requests):
            out.extend(self._keys_of(spec, batch, await self.compute_message(request)))
        return out


class CacheKeyClient(_CacheKeyCalls):
    """The blocking face (the CLI; the :class:`~tokenkeys.keys.strategy.RemoteKeyComputer` a
    key strategy falls back to, called from worker threads): the same calls and checks as
    :class:`AsyncCacheKeyClient`, over a blocking channel any thread may use."""

    def __init__(self, target: str, model: str = "", **options: Any) -> None:
        super().__init__(target, model, **options)
        self._channel = self.blocking_channel()
        self._stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> CacheKeyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def spec_message(self, *, include_vectors: bool = True) -> pb.CacheKeySpec:
        """The raw GetCacheKeySpec answer."""
        return self.call(self._stub.GetCacheKeySpec, self._spec_request(include_vectors))

    def spec(self, *, include_vectors: bool = True) -> CacheKeySpec:
        """The served spec, read from its ``spec_json`` and checked against the message."""
        return spec_from_message(self.spec_message(include_vectors=include_vectors))

    def compute_message(self, request: pb.ComputeCacheKeysRequest) -> pb.ComputeCacheKeysResponse:
        """One raw ComputeCacheKeys call (``request.model`` defaults to this client's model)."""
        if not request.model:
            request.model = self.model
        return self.call(self._stub.ComputeCacheKeys, request)

    def compute(self, spec: CacheKeySpec, requests: Sequence[KeyRequest]) -> list[list[BlockKey]]:
        """Keys of each request under ``spec``, computed by the server."""
        out: list[list[BlockKey]] = []
        for batch, request in self._compute_requests(spec, requests):
            out.extend(self._keys_of(spec, batch, self.compute_message(request)))
        return out


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
