"""Whether a ready worker is believed: what ``/router/workers`` and the metrics flag.

- ``load_underreported``: its GetLoad reported fewer running and queued requests than this
  router itself has in flight there, for :data:`DOUBT_POLLS` polls in a row (one poll can race
  a request that just finished or not yet arrived). Its load is then taken from the router's
  own count (``LoadView.load``); the flag tells the operator the engine's figures are wrong.
- ``events_silent``: requests were sent there ``silent_after`` seconds ago or more and no event
  batch of it was applied since. An engine that serves a request stores its prompt's blocks and
  publishes them; a ready worker that does not is routed to without prefix hits (its entries
  are stale), which a load-only view would never show.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenkeys.router.metrics import RouterMetrics
from tokenkeys.router.workers.load_view import LoadView
from tokenkeys.router.workers.pool import Pool
from tokenkeys.router.workers.state import WorkerState

#: Consecutive under-reporting polls before a worker's load is flagged.
DOUBT_POLLS = 3
#: Reasons a ready worker is flagged, as labelled in ``tokenkeys_router_worker_suspect``.
REASONS = ("load_underreported", "events_silent")


@dataclass(frozen=True)
class Suspicion:
    """Why a worker's reports are not believed."""

    reason: str
    message: str


def suspicions(
    view: LoadView, applied_at: float | None, silent_after: float, now: float
) -> list[Suspicion]:
    """What is wrong with one member's reports (``applied_at``, ``now``: ``view.wall`` time)."""
    out = []
    if view.underreports >= DOUBT_POLLS:
        claimed, inflight = view.last_claim
        out.append(
            Suspicion(
                "load_underreported",
                f"reported {claimed:g} running and queued requests in {view.underreports} "
                f"polls in a row while this router had {inflight} in flight there; "
                "routing with the router's own count",
            )
        )
    view.events_applied(applied_at)
    if view.waiting_since is not None and now - view.waiting_since >= silent_after:
        last = "never" if applied_at is None else f"{now - applied_at:.1f} s ago"
        out.append(
            Suspicion(
                "events_silent",
                f"no KV-event batch applied since requests were sent there "
                f"{now - view.waiting_since:.1f} s ago (last batch applied: {last}); its "
                "prefix entries are stale",
            )
        )
    return out


def flag_worker(
    metrics: RouterMetrics, pools: dict[str, Pool], ws: WorkerState, silent_after: float
) -> dict[str, list[Suspicion]]:
    """:func:`suspicions` of each model ``ws`` is a member for; sets the ``worker_suspect``
    and ``worker_last_event_batch_timestamp_seconds`` gauges on the way."""
    out: dict[str, list[Suspicion]] = {}
    for model, follower in ws.followers.items():
        member = pools[model].members.get(ws.address)
        if member is None:
            continue
        worker = pools[model].index_id(ws.address)
        view = member.view
        found = suspicions(view, follower.applied_at, silent_after, view.wall())
        out[model] = found
        flagged = {x.reason for x in found}
        for reason in REASONS:
            metrics.suspect.labels(worker, reason).set(reason in flagged)
        if follower.applied_at is not None:
            metrics.last_event_batch.labels(worker).set(follower.applied_at)
    return out
