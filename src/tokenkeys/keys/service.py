"""Cache keys of a served model (``ServedModel.cache_keys``): GetCacheKeySpec, ComputeCacheKeys.

The servicer stays a thin translation: it finds the model and hands the request here. This
module validates the whole request before computing anything (limits, the expected spec
fingerprint, every context), then computes every request's keys with the core's
:func:`~tokenkeys.keys.block_keys`, the same code a client's local strategy runs, and answers
full digests and the event form. ``tokenkeys keys`` runs the same :meth:`compute_now`.
"""

from __future__ import annotations

import asyncio
from array import array
from dataclasses import dataclass

from tokenkeys._gen.openengine.v1 import cache_keys_pb2 as pb
from tokenkeys.errors import ConfigError, FailedPrecondition, TokenkeysError
from tokenkeys.keys import CacheKeySpec, KeyContext, block_keys
from tokenkeys.keys.proto import (
    context_from_message,
    keys_to_message,
    message_field,
    signed_events,
    spec_ref,
    spec_to_message,
)
from tokenkeys.limits import MAX_ANSWER_BYTES, Limits

# Above this many tokens in one call the keys are computed on a worker thread, so one large
# call does not hold up the event loop's other RPCs for its whole duration.
_INLINE_TOKENS = 16_384


@dataclass(frozen=True)
class _Prepared:
    tokens: array
    context: KeyContext | None


class CacheKeyService:
    """Cache keys of one served model under one sealed spec.

    ``tokenizer_fingerprint`` is the served tokenizer's; a request whose context names another
    one was tokenized differently and is refused.
    """

    def __init__(
        self, spec: CacheKeySpec, limits: Limits, *, tokenizer_fingerprint: str | None = None
    ) -> None:
        if not spec.fingerprint:
            raise ValueError("CacheKeyService needs a sealed spec (tokenkeys.keys.make_spec)")
        self.spec = spec
        self.limits = limits
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self._signed = signed_events(spec)
        self._messages = {
            True: spec_to_message(spec, include_vectors=True),
            False: spec_to_message(spec, include_vectors=False),
        }
        size = self._messages[True].ByteSize()
        if size > MAX_ANSWER_BYTES:
            raise ConfigError(
                f"the {spec.profile_id} spec with hash unit {spec.hash_unit} carries "
                f"{size} bytes of test vectors, more than a client receives in one message "
                f"({MAX_ANSWER_BYTES}); use a smaller --block-size",
                field="block_size",
            )

    def spec_message(self, include_vectors: bool = True) -> pb.CacheKeySpec:
        """The GetCacheKeySpec answer (built once)."""
        return self._messages[bool(include_vectors)]

    def spec_ref(self) -> pb.CacheKeySpecRef:
        """The reference that ModelInfo and KV event sources carry."""
        return spec_ref(self.spec)

    async def compute(self, request: pb.ComputeCacheKeysRequest) -> pb.ComputeCacheKeysResponse:
        """ComputeCacheKeys: every request's keys, in order; nothing is answered half-done."""
        total = sum(len(r.token_ids) for r in request.requests)
        if total <= _INLINE_TOKENS:
            return self.compute_now(request)
        self._check_limits(request)  # refuse oversized calls before paying for a thread hop
        return await asyncio.to_thread(self.compute_now, request)

    def compute_now(self, request: pb.ComputeCacheKeysRequest) -> pb.ComputeCacheKeysResponse:
        """The same computation, synchronously (the CLI's local path)."""
        self._check_expected(request)
        self._check_limits(request)
        prepared = [self._prepare(i, r) for i, r in enumerate(request.requests)]
        response = pb.ComputeCacheKeysResponse(spec_fingerprint=self.spec.fingerprint)
        for i, item in enumerate(prepared):
            try:
                keys = block_keys(item.tokens, self.spec, item.context)
            except TokenkeysError as exc:
                raise _at(i, exc) from None
            response.results.append(keys_to_message(keys, signed=self._signed))
        return response

    def _check_expected(self, request: pb.ComputeCacheKeysRequest) -> None:
        if not request.HasField("expected_spec_fingerprint"):
            return
        expected = request.expected_spec_fingerprint
        if expected != self.spec.fingerprint:
            raise FailedPrecondition(
                f"expected_spec_fingerprint {expected!r} is not the served cache-key spec, whose "
                f"fingerprint is now {self.spec.fingerprint!r} ({self.spec.profile_id}): the "
                "deployment's spec changed; fetch it again with GetCacheKeySpec and retry",
                field="expected_spec_fingerprint",
                spec_fingerprint=self.spec.fingerprint,
            )

    def _check_limits(self, request: pb.ComputeCacheKeysRequest) -> None:
        self.limits.check_count("requests", len(request.requests))
        self.limits.check_tokens(
            "requests.token_ids", sum(len(r.token_ids) for r in request.requests)
        )

    def _prepare(self, i: int, request: pb.KeyRequest) -> _Prepared:
        context = None
        if request.HasField("context"):
            try:
                context = context_from_message(request.context)
            except TokenkeysError as exc:
                raise _at(i, exc) from None
            self._check_tokenizer(i, context)
        return _Prepared(array("I", request.token_ids), context)

    def _check_tokenizer(self, i: int, context: KeyContext) -> None:
        given = context.tokenizer_fingerprint
        if given is None or self.tokenizer_fingerprint is None:
            return
        if given != self.tokenizer_fingerprint:
            raise FailedPrecondition(
                f"requests[{i}].context.tokenizer_fingerprint {given!r} is not the served "
                f"tokenizer, whose fingerprint is {self.tokenizer_fingerprint!r}: the token ids "
                "were produced by another tokenizer; pull the served one and tokenize again",
                field=f"requests[{i}].context.tokenizer_fingerprint",
                fingerprint=self.tokenizer_fingerprint,
            )


def _at(i: int, exc: TokenkeysError) -> TokenkeysError:
    """The same error, located at ``requests[i]`` and the message field it is about."""
    name = message_field(exc.field)
    if name == "tokens":
        where = f"requests[{i}].token_ids"
    elif name is not None and not name.startswith("requests"):
        where = f"requests[{i}].context.{name}"
    else:
        where = name or f"requests[{i}]"
    error = type(exc)(f"{where}: {exc.message}", field=where, **exc.details)
    return error
