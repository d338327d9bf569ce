"""What a routing policy is given and what it answers, and the one method every policy has.

A policy is an object that owns whatever it remembers between requests (the cost model's
growth ledger, a round-robin turn, the text-chunk table) and answers one question,
:meth:`Policy.choose`: which of a pool's ready workers gets this request. The
:class:`~tokenkeys.router.policy.router.Router` finds the pool and its ready workers, asks the
policy, and counts the decision; it holds no policy's state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tokenkeys.keys import KeyContext
from tokenkeys.router.policy.scorer import WorkerScore
from tokenkeys.router.workers.pool import Pool


@dataclass(frozen=True)
class RouteRequest:
    """What routing needs of a request: its model, prompt ids and key context.

    ``text`` is used by the ``text_chunks`` policy only (default: the decoded prompt).
    ``workers``, when given, are the only workers that may serve it (e.g. those that serve the
    LoRA adapter it names); None: any ready worker of the pool.
    """

    token_ids: Sequence[int]
    model: str | None = None
    context: KeyContext | None = None
    text: str | None = None
    workers: frozenset[str] | None = None


@dataclass(frozen=True)
class RouteDecision:
    """The chosen worker (its address), why, and the ranking it was chosen from (best first).

    ``score`` is the chosen worker's in [0, 1]; ``matched_blocks`` of ``total_blocks`` full
    blocks of the prompt are cached there according to what the policy knows. ``keys`` are the
    prompt's block keys (precise policy), which the forwarder counts as in flight there.
    """

    worker: str
    model: str
    policy: str
    score: float
    matched_blocks: int
    total_blocks: int
    reason: str
    ranking: tuple[WorkerScore, ...] = ()
    keys: tuple[int, ...] = ()

    @classmethod
    def first_of(
        cls,
        ranking: Sequence[WorkerScore],
        *,
        model: str,
        policy: str,
        total_blocks: int,
        reason: str,
        keys: Sequence[int] = (),
    ) -> RouteDecision:
        """The decision for the first worker of ``ranking`` (best first, non-empty)."""
        best = ranking[0]
        return cls(
            best.worker,
            model,
            policy,
            best.score,
            best.matched_blocks,
            total_blocks,
            reason,
            tuple(ranking),
            tuple(keys),
        )

    def fallbacks(self) -> list[str]:
        """The other ranked workers, best first (where to retry if the chosen one fails)."""
        return [s.worker for s in self.ranking if s.worker != self.worker]

    def ranks_all(self, pool: Pool) -> bool:
        """Whether every worker of ``pool`` was ranked: the request may go to any of them (an
        adapter's goes only where it is served)."""
        return len(self.ranking) == len(pool.members)

    def cached_blocks(self, worker: str) -> int:
        """Leading blocks of the prompt the policy found cached at ``worker`` (0 if unranked)."""
        return next((s.matched_blocks for s in self.ranking if s.worker == worker), 0)


@runtime_checkable
class Policy(Protocol):
    """One way of choosing a worker; see the module doc."""

    #: The policy's name, as ``--policy`` and the decision metrics spell it.
    name: str

    async def choose(
        self, pool: Pool, request: RouteRequest, load: Mapping[str, float], *, record: bool
    ) -> RouteDecision:
        """The worker of ``pool`` for ``request``, among ``load``'s ready workers (non-empty).

        ``record`` False asks without acting on the answer: the policy remembers nothing of it.
        """
        ...

    def forget(self, pool: Pool, address: str) -> None:
        """Drop what the policy remembers of ``address``, which left ``pool``."""
        ...
