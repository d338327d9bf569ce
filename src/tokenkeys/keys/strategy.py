"""Client key strategy: compute keys locally only when the spec's own vectors prove it safe.

Given a spec (as served by ``GetCacheKeySpec``, a dict or a :class:`CacheKeySpec`), the
strategy decides once, at construction:

* ``local``: the profile is known here, every spec field is what the profile builds from the
  spec's own parameters (:func:`~tokenkeys.keys.compute.check_spec`: root, groups, rules), it is
  client-computable, the spec is intact (vectors digest and fingerprint recompute), and every
  carried vector passes through the local implementation;
* ``remote``: anything else, when a :class:`RemoteKeyComputer` (``ComputeCacheKeys``) is given;
* ``refused``: anything else without a remote computer; computing then raises.

A strict strategy raises at construction instead of falling back. The decision and its reason
are in :attr:`KeyStrategy.decision`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tokenkeys.errors import FailedPrecondition, TokenkeysError, Unsupported
from tokenkeys.keys.compute import block_key_array, block_keys, check_spec
from tokenkeys.keys.context import KeyContext
from tokenkeys.keys.spec import BlockKey, CacheKeySpec, KeyArray, vectors_digest
from tokenkeys.keys.vectors import VectorReport, verify_vectors


@dataclass(frozen=True)
class KeyRequest:
    """One request's inputs to key computation."""

    tokens: Sequence[int]
    context: KeyContext | None = None


class RemoteKeyComputer(Protocol):
    """Computes keys authoritatively elsewhere (the engine's ``ComputeCacheKeys``)."""

    def compute(self, spec: CacheKeySpec, requests: Sequence[KeyRequest]) -> list[list[BlockKey]]:
        """Keys for each request, in order, under ``spec``."""
        ...


@dataclass(frozen=True)
class Decision:
    """How keys will be computed, and why."""

    mode: Literal["local", "remote", "refused"]
    reason: str
    report: VectorReport | None = None


def _local_verdict(spec: CacheKeySpec) -> tuple[bool, str, VectorReport | None]:
    try:
        profile = check_spec(spec)
    except TokenkeysError as exc:
        return False, exc.message, None
    if not profile.client_computable:
        return (
            False,
            f"profile {spec.profile_id} is not client-computable (its serialization is CPython "
            "pickle, reproducible only inside the engine's Python)",
            None,
        )
    if not spec.vectors:
        return False, "the spec carries no test vectors to prove a local implementation", None
    if vectors_digest(spec.vectors) != spec.vectors_digest:
        return False, "the spec's vectors do not match its vectors_digest", None
    if spec.sealed().fingerprint != spec.fingerprint:
        return False, "the spec's fingerprint does not match its contents", None
    report = verify_vectors(spec)
    if not report.passed:
        return (
            False,
            f"local implementation fails the spec's vectors: {report.first_failure}",
            report,
        )
    return True, f"all {report.total} vectors of {spec.profile_id} pass locally", report


class KeyStrategy:
    """Local-or-remote key computation for one spec; see the module docstring."""

    def __init__(
        self,
        spec: CacheKeySpec | Mapping[str, Any],
        remote: RemoteKeyComputer | None = None,
        *,
        strict: bool = False,
    ) -> None:
        parsed: CacheKeySpec | None = None
        try:
            parsed = spec if isinstance(spec, CacheKeySpec) else CacheKeySpec.from_dict(spec)
            local, reason, report = _local_verdict(parsed)
        except TokenkeysError as exc:
            local, reason, report = False, f"the spec cannot be read: {exc.message}", None
        self.spec = parsed
        self.remote = remote
        if local:
            self.decision = Decision("local", reason, report)
        elif strict:
            raise Unsupported(
                f"strict key strategy refuses to fall back: {reason}", field="spec", report=report
            )
        elif remote is not None and parsed is not None:
            self.decision = Decision("remote", reason, report)
        else:
            self.decision = Decision(
                "refused",
                reason + ("; no remote key computer was given" if remote is None else ""),
                report,
            )

    def compute(self, tokens: Sequence[int], context: KeyContext | None = None) -> list[BlockKey]:
        """Keys of one request."""
        return self.compute_many([KeyRequest(tokens, context)])[0]

    def compute_array(self, tokens: Sequence[int], context: KeyContext | None = None) -> KeyArray:
        """:meth:`compute` for a local strategy as a :class:`KeyArray`
        (:func:`~tokenkeys.keys.block_key_array`: the same keys and errors, no object per
        block); a router reads its :attr:`KeyArray.index_keys`. Other modes have no array: the
        engine's keys come back as objects (:meth:`compute`)."""
        if self.decision.mode == "local" and self.spec is not None:
            return block_key_array(tokens, self.spec, context)
        raise Unsupported(
            f"keys are not computed here for this spec ({self.decision.mode}): "
            f"{self.decision.reason}",
            field="spec",
        )

    def compute_many(self, requests: Sequence[KeyRequest]) -> list[list[BlockKey]]:
        """Keys of several requests, in order."""
        mode = self.decision.mode
        if mode == "local" and self.spec is not None:
            return [block_keys(r.tokens, self.spec, r.context) for r in requests]
        if mode == "remote" and self.remote is not None and self.spec is not None:
            result = self.remote.compute(self.spec, list(requests))
            if len(result) != len(requests):
                raise FailedPrecondition(
                    f"remote key computer returned {len(result)} results for {len(requests)} "
                    "requests",
                    field="requests",
                )
            return result
        raise Unsupported(
            f"keys cannot be computed for this spec: {self.decision.reason}", field="spec"
        )
