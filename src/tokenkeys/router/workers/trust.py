"""Whether a ready worker is believed: what ``/router/workers`` and the metrics flag.

- ``load_underreported``: its GetLoad reported fewer running and queued requests than this
  router itself has in flight there, for :data:`DOUBT_POLLS` polls in a row (one poll can race
  a request that just finished or not yet arrived). Its load is then taken from the router's
  own count (``LoadView.load``); the flag tells the operator the engine's figures are wrong.
- ``events_silent``: requests were sent there ``silent_after`` seconds ago or more and no event
  batch of it was applied since. An engine that serves a request stores its prompt's blocks and
  publishes them; a ready worker that does not is routed to without prefix hits (its entries
  are stale), which a load-only view would never show.

Reading them changes nothing (:func:`worker_suspicions`, what ``GET /router/workers`` shows);
the health poll alone takes each batch into the view and sets the gauges (:func:`flag_worker`).
"""

from __future__ import annotations

from collections.abc import Iterator
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
    """What is wrong with one member's reports (``applied_at``, ``now``: ``view.wall`` time).

    Pure: the view is read as it will be once the batch applied at ``applied_at`` is taken.
    """
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
    waiting_since = view.waiting_after(applied_at)
    if waiting_since is not None and now - waiting_since >= silent_after:
        last = "never" if applied_at is None else f"{now - applied_at:.1f} s ago"
        out.append(
            Suspicion(
                "events_silent",
                f"no KV-event batch applied since requests were sent there "
                f"{now - waiting_since:.1f} s ago (last batch applied: {last}); its "
                "prefix entries are stale",
            )
        )
    return out


def _members(
    pools: dict[str, Pool], ws: WorkerState
) -> Iterator[tuple[str, Pool, LoadView, float | None]]:
    """(model, pool, load view, last batch applied at) of each model ``ws`` is a member for."""
    for model, follower in ws.followers.items():
        member = pools[model].members.get(ws.address)
        if member is not None:
            yield model, pools[model], member.view, follower.applied_at


def worker_suspicions(
    pools: dict[str, Pool], ws: WorkerState, silent_after: float
) -> dict[str, list[Suspicion]]:
    """:func:`suspicions` of each model ``ws`` is a member for; reads only."""
    return {
        model: suspicions(view, applied_at, silent_after, view.wall())
        for model, _pool, view, applied_at in _members(pools, ws)
    }


def flag_worker(
    metrics: RouterMetrics, pools: dict[str, Pool], ws: WorkerState, silent_after: float
) -> None:
    """The health poll's step: each member view takes its last applied batch, and the
    ``worker_suspect`` and ``worker_last_event_batch_timestamp_seconds`` gauges are set."""
    for _model, pool, view, applied_at in _members(pools, ws):
        view.events_applied(applied_at)
        flagged = {x.reason for x in suspicions(view, applied_at, silent_after, view.wall())}
        worker = pool.index_id(ws.address)
        for reason in REASONS:
            metrics.suspect.labels(worker, reason).set(reason in flagged)
        if applied_at is not None:
            metrics.last_event_batch.labels(worker).set(applied_at)
