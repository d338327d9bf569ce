"""The JSON views of the registry (``GET /router/workers``): pools, workers, their suspicions.

A view reads a worker's state (``state``) and what ``trust`` concludes from it; nothing here
changes either.
"""

from __future__ import annotations

from tokenkeys.router.workers.pool import Pool
from tokenkeys.router.workers.state import WorkerState
from tokenkeys.router.workers.trust import Suspicion, worker_suspicions


def worker_status(ws: WorkerState, suspicions: dict[str, list[Suspicion]]) -> dict:
    """One worker as JSON, with its ``suspicions`` by model (``trust``)."""
    return {
        "address": ws.address,
        "state": ws.state,
        "instance_id": ws.instance_id,
        "models": sorted(ws.engines),
        "events": {
            model: {
                "last_seq": f.last_seq,
                "resyncing": f.resyncing,
                "last_batch_applied_at": f.applied_at,
                "index_writes": f.backoff.as_dict(),
            }
            for model, f in ws.followers.items()
        },
        "suspect": {
            model: [{"reason": x.reason, "message": x.message} for x in found]
            for model, found in suspicions.items()
            if found
        },
        "refusals": [
            {"model": r.model, "reason": r.reason, "message": r.message} for r in ws.refusals
        ],
        "error": ws.error,
        "missed_polls": ws.missed_polls,
    }


def pool_status(pool: Pool) -> dict:
    """A JSON-ready summary of a pool: identity, key strategy and why, block size, members."""
    return {
        "model": pool.name,
        "tokenizer_fingerprint": pool.fingerprint,
        "key_spec": {
            "profile_id": pool.key_spec.profile_id,
            "spec_fingerprint": pool.key_spec.spec_fingerprint,
        },
        "key_strategy": pool.strategy.decision.mode,
        "key_strategy_reason": pool.strategy.decision.reason,
        "block_size": pool.block_size,
        "members": sorted(pool.members),
    }


def registry_status(
    pools: dict[str, Pool], workers: dict[str, WorkerState], silent_after: float
) -> dict:
    """Pools and workers as JSON, each worker with its suspicions (``silent_after``: ``trust``)."""
    return {
        "pools": [pool_status(pool) for pool in pools.values()],
        "workers": [
            worker_status(ws, worker_suspicions(pools, ws, silent_after)) for ws in workers.values()
        ],
    }
