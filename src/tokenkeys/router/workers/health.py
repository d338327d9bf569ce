"""Health polling of workers: load, restarts, rejoins, and the prefix index itself.

A poll every ``interval`` seconds reads each worker's ``GetLoad`` (and :meth:`refresh` reads it
after each request forwarded there): the load and KV blocks in use feed the routing cost, and a
new ``instance_id`` at a known address (an engine restart) makes it leave and rejoin.

A worker that refuses the connection is down at once; one that is reachable but does not
answer before the deadline is down only after ``down_after`` such polls in a row. A loaded
host (the worker's, or the router's own, whose event loop may be late to read the answer)
misses a deadline now and then, and taking the worker out for it would clear its index
entries, which only its events can rebuild, and send its conversations elsewhere. Kubernetes
probes (``failureThreshold``) and load balancers' unhealthy thresholds count misses the same
way, 3 by default as here.

Down and refused workers are described again at each poll; a worker that answers again
rejoins with a cleared index entry, rebuilt from its events (replayed from sequence 0 as far as
the engine still buffers them). A request that failed on a worker wakes the poll at once.
"""

from __future__ import annotations

import asyncio
import logging

from tokenkeys.errors import TokenkeysError, Unavailable
from tokenkeys.router.index.model import PrefixIndex
from tokenkeys.router.workers.admission import Admission
from tokenkeys.router.workers.discovery import WorkerLoad, keys_verified, read_load
from tokenkeys.router.workers.following import EventFollowing
from tokenkeys.router.workers.state import WorkerState
from tokenkeys.router.workers.tasks import BackgroundTasks, cancel
from tokenkeys.router.workers.trust import flag_worker

log = logging.getLogger(__name__)

#: GetLoad polls in a row a reachable worker may leave unanswered before it is marked down.
DOWN_AFTER = 3
#: Seconds between two reads of a worker's load after requests (:meth:`HealthPolling.refresh`).
#: A read per request cost the router (a gRPC call, its poller thread) and the worker about
#: a fifth of the router's CPU per forwarded request (py-spy, bench/bench_front_door.py);
#: between reads the router counts its own requests in flight there, so the figures a
#: decision uses lag at most this much (and a read's round trip) behind the worker's.
REFRESH_SPACING = 0.05


class HealthPolling:
    """The poll loop and the per-worker checks; its tasks end at :meth:`close`."""

    def __init__(
        self,
        index: PrefixIndex,
        admission: Admission,
        workers: dict[str, WorkerState],
        *,
        interval: float,
        timeout: float,
        down_after: int = DOWN_AFTER,
        silent_after: float = 30.0,
    ) -> None:
        self.index = index
        #: GetLoad deadlines a ready worker may miss in a row before it is marked down.
        self.down_after = down_after
        #: Seconds without an event batch after a request before a worker is flagged silent.
        self.silent_after = silent_after
        self.admission = admission
        self.workers = workers
        self.interval = interval
        self.timeout = timeout
        #: False while the prefix index answers Unavailable (as of the last poll).
        self.index_available = True
        self._poller: asyncio.Task | None = None
        self._refreshing: set[str] = set()
        #: When each worker's load was last read after a request (event-loop time).
        self._refreshed: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._tasks = BackgroundTasks()

    def start(self) -> None:
        """Start polling every ``interval`` seconds."""
        if self._poller is None:
            self._poller = asyncio.ensure_future(self._poll_forever())

    async def close(self) -> None:
        """Stop the poll loop and every refresh in flight."""
        await cancel(self._poller)
        self._poller = None
        await self._tasks.close()

    def suspect(self, address: str) -> None:
        """A request to ``address`` failed: check it at once instead of at the next poll."""
        self._wake.set()

    def refresh(self, address: str) -> None:
        """Read ``address``'s load now (in the background), e.g. after a request finished there.

        Polls alone leave the load and KV usage up to ``interval`` seconds old, and a burst of
        new prefixes would then tie on stale figures. At most one refresh per worker is pending
        (asked for while one waits or runs: that one covers it), and reads of a worker are
        :data:`REFRESH_SPACING` apart: a refresh asked for sooner waits for the spacing.
        """
        ws = self.workers.get(address)
        if ws is None or ws.state != "ready" or address in self._refreshing:
            return
        self._refreshing.add(address)
        now = asyncio.get_running_loop().time()
        wait = self._refreshed.get(address, float("-inf")) + REFRESH_SPACING - now
        task = self._tasks.spawn(self._refresh(ws, wait))
        task.add_done_callback(lambda _: self._refreshing.discard(address))

    async def _refresh(self, ws: WorkerState, wait: float) -> None:
        if wait > 0:
            await asyncio.sleep(wait)
        self._refreshed[ws.address] = asyncio.get_running_loop().time()
        if ws.state != "ready":
            return
        try:
            load = await read_load(ws.address, ws.control, timeout=self.timeout)
        except TokenkeysError:
            self.suspect(ws.address)  # the next check decides
            return
        if load.instance_id != ws.instance_id:
            self.suspect(ws.address)
            return
        self._apply_load(ws, load)

    def _apply_load(self, ws: WorkerState, load: WorkerLoad) -> None:
        for model in ws.engines:
            member = self.admission.pools[model].members.get(ws.address)
            if member is not None:
                member.view.polled(
                    load.load, load.kv_usage, load.used_kv_blocks, load.total_kv_blocks
                )

    async def poll_once(self) -> None:
        """Check the index and every worker once (what each poll does)."""
        await self._check_index()
        await asyncio.gather(*(self.check(ws) for ws in list(self.workers.values())))
        self.admission.count_states()
        for ws in self.workers.values():
            flag_worker(self.admission.metrics, self.admission.pools, ws, self.silent_after)

    async def _check_index(self) -> None:
        """Notice the index going away and coming back (a Redis restart comes back empty);
        when it is back, every followed worker is rebuilt (:meth:`EventFollowing.rebuild`)."""
        try:
            await self.index.workers()
        except Unavailable as exc:
            if self.index_available:
                log.warning("prefix index unavailable, routing by load: %s", exc.message)
            self.index_available = False
            return
        if self.index_available:
            return
        self.index_available = True
        log.info("prefix index available again: rebuilding every worker's entries")
        EventFollowing.rebuild(self.workers)

    async def _poll_forever(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.poll_once()
            except Exception:  # a poll must never end the loop; the next one retries
                log.exception("worker poll failed")

    async def check(self, ws: WorkerState) -> None:
        """One worker: its load when ready (down or restarted otherwise), else try to join."""
        admission = self.admission
        async with ws.lock:
            if ws.state != "ready":
                await admission.join(ws, "joined" if ws.description is None else "rejoined")
                return
            try:
                load = await read_load(ws.address, ws.control, timeout=self.timeout)
            except TokenkeysError as exc:
                if exc.details.get("timed_out") and ws.missed_polls + 1 < self.down_after:
                    self._missed(ws, exc.message)
                else:
                    await admission.go_down(ws, exc.message)
                return
            ws.missed_polls, ws.error = 0, None
            if load.instance_id and load.instance_id != ws.instance_id:
                log.info("worker %s restarted (instance %s)", ws.address, load.instance_id)
                admission.metrics.worker_events.labels("restarted").inc()
                await admission.leave_all(ws, "worker_restarted")
                await admission.join(ws, "rejoined")
                return
            self._apply_load(ws, load)
            await self._check_keys(ws)

    def _missed(self, ws: WorkerState, message: str) -> None:
        """A ready worker did not answer GetLoad in time: counted, kept ready (stale load)."""
        ws.missed_polls, ws.error = ws.missed_polls + 1, message
        self.admission.metrics.worker_events.labels("poll_missed").inc()
        log.warning(
            "worker %s missed a poll (%d in a row; down at %d): %s",
            ws.address,
            ws.missed_polls,
            self.down_after,
            message,
        )

    async def _check_keys(self, ws: WorkerState) -> None:
        """Stop trusting the keys of a model whose worker now advertises them unverified.

        One GetModelInfo per trusted model and poll; a worker's verdict never turns back (its
        engine published a hash no key of the spec reproduces), until it restarts and rejoins.
        """
        for model in ws.engines:
            member = self.admission.pools[model].members.get(ws.address)
            if member is None or not member.keys_trusted:
                continue
            try:
                verified = await keys_verified(ws.address, ws.control, model, timeout=self.timeout)
            except TokenkeysError:
                continue  # the next poll's GetLoad decides whether it is down
            if not verified:
                member.keys_trusted = False
                self.admission.metrics.worker_events.labels("keys_unverified").inc()
                log.warning(
                    "worker %s advertises unverified keys for %s: routed by load from now on",
                    ws.address,
                    model,
                )
