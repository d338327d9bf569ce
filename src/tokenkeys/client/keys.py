"""Cache keys from a server: the spec, remote computation, and the router's key strategy.

:class:`CacheKeyClient` calls ``GetCacheKeySpec`` and ``ComputeCacheKeys`` (blocking, like
:class:`~tokenkeys.client.TokenizerClient`) and is the :class:`RemoteKeyComputer` a
:class:`~tokenkeys.keys.strategy.KeyStrategy` falls back to. :func:`strategy_from_server` is
what a router calls once per served model: fetch the spec, check its fingerprint against the one
discovery advertised, run the spec's vectors locally, and decide local or remote.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import grpc

from tokenkeys._gen.openengine.v1 import cache_keys_pb2 as pb
from tokenkeys._gen.openengine.v1 import tokenizer_pb2_grpc
from tokenkeys.errors import FailedPrecondition, InvalidArgument, from_grpc
from tokenkeys.keys import BlockKey, CacheKeySpec
from tokenkeys.keys.proto import (
    keys_from_message,
    request_to_message,
    signed_events,
    spec_from_message,
)
from tokenkeys.keys.strategy import KeyRequest, KeyStrategy

log = logging.getLogger(__name__)

# The largest answer accepted (a spec with its vectors); servers refuse to serve larger ones.
MAX_SPEC_BYTES = 64 * 1024 * 1024


class CacheKeyClient:
    """Calls the cache-key RPCs of one served model; gRPC errors become the tokenkeys tree.

    ``compute`` splits a large batch into calls of at most ``max_requests_per_call`` requests
    and ``max_tokens_per_call`` token ids (the server's ``--max-texts-per-request`` and
    ``--max-tokens-per-request`` must be at least these).
    """

    def __init__(
        self,
        target: str,
        model: str = "",
        *,
        timeout: float = 30.0,
        max_requests_per_call: int = 256,
        max_tokens_per_call: int = 262_144,
    ) -> None:
        if max_requests_per_call < 1 or max_tokens_per_call < 1:
            raise InvalidArgument(
                "max_requests_per_call and max_tokens_per_call must be at least 1",
                field="max_requests_per_call",
            )
        self.target = target
        self.model = model
        self.timeout = timeout
        self.max_requests_per_call = max_requests_per_call
        self.max_tokens_per_call = max_tokens_per_call
        self._channel = grpc.insecure_channel(
            target, options=[("grpc.max_receive_message_length", MAX_SPEC_BYTES)]
        )
        self._stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> CacheKeyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method, request):  # noqa: ANN001, ANN202
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise from_grpc(error) from error

    def spec_message(self, *, include_vectors: bool = True) -> pb.CacheKeySpec:
        """The raw GetCacheKeySpec answer."""
        request = pb.GetCacheKeySpecRequest(model=self.model, include_vectors=include_vectors)
        return self._call(self._stub.GetCacheKeySpec, request)

    def spec(self, *, include_vectors: bool = True) -> CacheKeySpec:
        """The served spec, read from its ``spec_json`` and checked against the message."""
        return spec_from_message(self.spec_message(include_vectors=include_vectors))

    def compute_message(self, request: pb.ComputeCacheKeysRequest) -> pb.ComputeCacheKeysResponse:
        """One raw ComputeCacheKeys call (``request.model`` defaults to this client's model)."""
        if not request.model:
            request.model = self.model
        return self._call(self._stub.ComputeCacheKeys, request)

    def compute(self, spec: CacheKeySpec, requests: Sequence[KeyRequest]) -> list[list[BlockKey]]:
        """Keys of each request under ``spec``, computed by the server (RemoteKeyComputer).

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
            response = self.compute_message(request)
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
