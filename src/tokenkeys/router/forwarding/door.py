"""One request through the front door: open, tokenize, route, forward, relay, keep the promise.

:class:`FrontDoor` builds the handler of each forwarded route (``routes``). The request is
opened as the worker's frontend opens it (bounded body, schema, model), its prompts tokenized
by the pool's one Preprocessor and routed as before; then the client's bytes go to the chosen
worker's frontend and its answer comes back: status, headers, body or events, error bodies
included. A worker that refuses the connection, fails or answers 503 before the first byte of
its answer is reported to the registry and the next worker of the ranking gets the request
(each try counted as ``retried`` in ``tokenkeys_router_requests_total`` and said in
``x-tokenkeys-retries``). A client that disconnects while it waits closes the worker's
connection, which aborts the worker's request. Beside router replicas, a request the stream's
order sends elsewhere (the later copy of a new prompt a peer placed on another worker at the
same instant, or a new prompt balanced away from a worker a burst piled on) is moved there the
same way before its answer's head arrives (counted as ``moved``; ``router.replicas.
reconcile``): for a streamed answer that head comes at once, so mostly whole answers move.

A worker without an HTTP frontend is served as before the front door, by the frontend's own
route over OpenEngine ``Generate`` (:class:`~tokenkeys.router.routed_engine.RoutedEngine`), with
this decision handed to it (:attr:`RouteNote.preset`) so nothing is routed twice.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tokenkeys.errors import Unavailable, Unsupported
from tokenkeys.frontend.access_log import note_prompt_tokens
from tokenkeys.frontend.opening import Opened, open_request
from tokenkeys.keys import Adapter, KeyContext
from tokenkeys.router.explain.accuracy import Accuracy
from tokenkeys.router.explain.causes import Explanation
from tokenkeys.router.explain.endpoint import asked
from tokenkeys.router.forwarding.adapters import WorkerAdapters, request_context
from tokenkeys.router.forwarding.answer import WholeAnswer, chunk_relay, event_relay
from tokenkeys.router.forwarding.client_side import ClientGone, replay, unless_gone
from tokenkeys.router.forwarding.frontends import WorkerFrontends
from tokenkeys.router.forwarding.http1 import Reply
from tokenkeys.router.forwarding.image_ids import ImageModelIds
from tokenkeys.router.forwarding.promise import Promise, PromiseMetrics, answer_usage, matched_at
from tokenkeys.router.forwarding.relay import Relay, WorkerUnreachable, answer_headers, read_all
from tokenkeys.router.forwarding.routes import ForwardedRoute, Prompt
from tokenkeys.router.policy.decision import RouteDecision, RouteRequest
from tokenkeys.router.policy.router import Router
from tokenkeys.router.replicas.moves import Moved, unless_moved
from tokenkeys.router.replicas.sharing import LocalLoad, SharedLoad
from tokenkeys.router.routed_engine import RouteNote, current_note
from tokenkeys.router.workers.load_view import Flight
from tokenkeys.router.workers.pool import Member, Pool
from tokenkeys.router.workers.registry import WorkerRegistry

T = TypeVar("T")
Endpoint = Callable[[Request], Awaitable[Response]]
#: Records one finished request's promise (metrics, accuracy).
Keep = Callable[[Promise], None]


@dataclass
class _Trip:
    """One attempt on one worker: what it holds of the load while it runs."""

    member: Member
    flight: Flight | None


class FrontDoor:
    """The forwarding handlers of a router app; see the module doc."""

    def __init__(
        self,
        router: Router,
        registry: WorkerRegistry,
        frontends: WorkerFrontends,
        relay: Relay,
        promises: PromiseMetrics,
        shared: SharedLoad | None = None,
        *,
        accuracy: Accuracy | None = None,
        image_model_id: str | None = None,
    ) -> None:
        self.router = router
        self.registry = registry
        self.frontends = frontends
        self.relay = relay
        self.promises = promises
        self.shared = shared if shared is not None else LocalLoad()
        #: Promised against served per worker, and the explanations (``router.explain``).
        self.accuracy = accuracy
        #: The LoRA adapters the workers' frontends list (``adapters``), and their roots.
        self.adapters = WorkerAdapters(frontends, relay)
        #: The model id each pool's images are hashed with (``image_ids``); ``image_model_id``
        #: is ``route --mm-model-id``.
        self.image_ids = ImageModelIds(image_model_id)

    async def start(self, interval: float) -> None:
        """Learn the workers' adapters now, then again every ``interval`` seconds."""
        await self.adapters.refresh(self.registry.workers)
        self.adapters.start(lambda: list(self.registry.workers), interval)

    async def close(self) -> None:
        """Stop learning adapters."""
        await self.adapters.close()

    def adapters_of(self, model: str) -> tuple[Adapter, ...]:
        """The LoRA adapters of ``model`` its pool's workers list."""
        pool = self.router.pools.get(model)
        return self.adapters.of(model, pool.members) if pool is not None else ()

    def workers_for(self, pool: Pool, context: KeyContext | None) -> frozenset[str] | None:
        """The workers a request of ``context`` may go to: those whose frontend lists the LoRA
        adapter it names (any other answers 404); None (any) without an adapter."""
        if context is None or context.adapter is None:
            return None
        return self.adapters.serving(pool.name, context.adapter, pool.members)

    async def prompts(self, route: ForwardedRoute, opened: Opened, pool: Pool) -> list[Prompt]:
        """The body's prompts as ``route``'s worker builds them, keyable: none (route by load,
        forward unchanged) when one cannot be built exactly (truncate_prompt_tokens,
        prompt_embeds, ...) or an image has no identifier (the pool's workers state no engine
        model id, or contradict each other: ``image_ids``)."""
        self.image_ids.settle(pool, self.adapters.roots)
        try:
            prompts = await opened.run(route.prompts, opened.model.preprocessor, opened.body)
        except Unsupported:
            return []
        return prompts if all(p.keyable for p in prompts) else []

    def handler(self, route: ForwardedRoute, fallback: Endpoint | None) -> Endpoint:
        """The endpoint of ``route``; ``fallback`` serves a worker without an HTTP frontend."""

        async def forward(request: Request) -> Response:
            return await self.forward(request, route, fallback)

        return forward

    async def forward(
        self, request: Request, route: ForwardedRoute, fallback: Endpoint | None
    ) -> Response:
        """Route ``request`` and answer with the chosen worker's answer."""
        opened = await open_request(request, route.schema, route.check)
        pool = self.router.pool(opened.model.name)
        context = request_context(opened)
        workers = self.workers_for(pool, context)
        # Without prompts (see ``prompts``) the request gets no keys, so it is routed by load
        # alone and forwarded as it came; the worker, whose frontend builds it, answers. A
        # worker without a frontend refuses it on the Generate path, as before.
        prompts = await self.prompts(route, opened, pool)
        contexts = [p.context(context) for p in prompts] or [context]
        decisions = []
        counted: tuple[RouteDecision, float] | None = None
        for i, prompt in enumerate(prompts or [Prompt([])]):
            # One worker serves the whole body: the first prompt decides, the others are only
            # looked up (what they will find cached there is part of the promise).
            wanted = RouteRequest(prompt.ids, pool.name, contexts[i], workers=workers)
            record = route.generates and i == 0
            decision, seconds = await self.router.decide(wanted, record=record)
            if record:
                counted = (decision, seconds)
            decisions.append(decision)
        first = decisions[0]
        note = current_note.get() or RouteNote()
        if self.frontends.url(first.worker) is None:
            if counted is not None:
                self.router.count(*counted)
            return await self._generate(request, opened, fallback, note, first)
        note.decisions.append(first)
        ids, keyed = (prompts[0].ids, contexts[0]) if prompts else ([], context)
        explained = None
        explaining = bool(prompts) and self.accuracy is not None and asked(request)
        if explaining:
            assert self.accuracy is not None
            # Taken now: the worker's answer stores the prompt's blocks.
            self.accuracy.explainer.routed(pool, keyed)
            explained = await self.accuracy.explainer.explain(
                pool, ids, keyed, keys=first.keys or None
            )

        @functools.cache
        def settle() -> Keep:
            """What is counted of the decision, run once by whoever asks first: the relay once
            the request is written (the worker computes meanwhile), before its answer is
            awaited, so nothing in between can change what it reads; or the door when no
            request was written. Its keeper of the promise after."""
            if counted is not None:
                self.router.count(*counted)
            if not prompts:  # nothing was promised: no promise to keep, nothing to explain
                return _kept_nowhere
            if route.generates:
                # The access line's prompt tokens: the ids the router decided on are the
                # worker's, whose Preprocessor fingerprint the pool checked; a stream's usage
                # comes too late.
                note_prompt_tokens(sum(len(p.ids) for p in prompts))
            if self.accuracy is not None and not explaining:
                self.accuracy.explainer.routed(pool, keyed)
            return self._keeper(pool, ids, keyed, first)

        lengths = tuple(len(p.ids) for p in prompts) or (0,)
        return await self._forward(
            request, opened, route, pool, lengths, decisions, note, settle, explained
        )

    def _keeper(
        self, pool: Pool, ids: list[int], context: KeyContext | None, decision: RouteDecision
    ) -> Keep:
        accuracy = self.accuracy
        # The chosen worker's miss as routed (its answer stores the prompt's blocks).
        chosen = accuracy.miss(pool, decision, decision.worker, len(ids)) if accuracy else None

        def keep(promise: Promise) -> None:
            self.promises.record(promise)
            if accuracy is not None:
                missed = (
                    chosen
                    if promise.worker == decision.worker
                    else accuracy.miss(pool, decision, promise.worker, len(ids))
                )
                accuracy.record(promise, pool, ids, context, decision, missed)

        return keep

    async def _generate(
        self,
        request: Request,
        opened: Opened,
        fallback: Endpoint | None,
        note: RouteNote,
        decision: RouteDecision,
    ) -> Response:
        if fallback is None:
            raise Unsupported(
                f"worker {decision.worker} advertises no HTTP frontend and "
                f"{request.url.path} is only served by forwarding; name its frontend with "
                "--worker GRPC_HOST:PORT,http://HOST:PORT",
                field="worker",
            )
        note.preset = decision
        return await fallback(Request(request.scope, replay(opened.raw, request.receive)))

    async def _forward(
        self,
        request: Request,
        opened: Opened,
        route: ForwardedRoute,
        pool: Pool,
        lengths: tuple[int, ...],
        decisions: list[RouteDecision],
        note: RouteNote,
        settle: Callable[[], Keep],
        explained: Explanation | None,
    ) -> Response:
        first = decisions[0]
        metrics = self.router.metrics
        failures: list[str] = []
        order = [first.worker, *first.fallbacks()]
        scope = request.scope
        # Balanced by the stream's order: a request any worker may take, not a streamed one.
        anywhere = first.ranks_all(pool) and not opened.body.get("stream")
        movable = True
        while order:
            address = order.pop(0)
            url, member = self.frontends.url(address), pool.members.get(address)
            if url is None or member is None:
                continue
            trip = self._begin(pool, member, first, route.generates, movable and anywhere)
            # A later copy of a new prompt a peer placed elsewhere goes there before its
            # answer's head arrives (router.replicas.reconcile).
            move = self.shared.moves(trip.flight) if trip.flight and movable else None
            promised: list[Promise] = []

            def sent(address: str = address, promised: list[Promise] = promised) -> None:
                # The request is on its way: the decision's bookkeeping and this worker's
                # promise are made while it computes.
                settle()
                matched = matched_at(address, decisions, opened.body)
                promised.append(Promise(address, pool.name, pool.block_size, lengths, matched))

            try:
                opening = self.relay.open(url + scope["path"], opened.raw, scope["headers"], sent)
                if move is not None:
                    opening = unless_moved(opening, move, Reply.close)
                response = await unless_gone(request, opening)
                if response.status == 503 and order:
                    response.close()
                    raise WorkerUnreachable("answered 503 (unavailable)")
            except Moved as moved:
                self._end(trip)
                metrics.requests_of[(address, "moved")].inc()
                order = moved.then(address, order)
                movable = False
                continue
            except ClientGone:
                self._end(trip)
                settle()
                # Nobody reads this answer; closing the worker's connection aborted its request.
                return Response(status_code=499)
            except WorkerUnreachable as exc:
                self._end(trip)
                metrics.requests_of[(address, "retried")].inc()
                failures.append(f"{address}: {exc}")
                self.registry.suspect(address)
                continue
            except BaseException:
                self._end(trip)
                settle()
                raise
            if trip.flight is not None:
                member.view.first_output(trip.flight)
                self.shared.answered(trip.flight)
            note.served_by.append(address)
            note.retries = len(failures)
            part = explained.worker(address) if explained is not None else None
            if part is not None:
                assert explained is not None
                note.explanation = (part, explained.prompt_blocks)
            return await self._answer(response, trip, promised[0], note, route.generates, settle())
        settle()
        raise Unavailable(
            f"no worker of {pool.name!r} accepted the request: " + "; ".join(failures or ["none"]),
            field="model",
        )

    def _begin(
        self, pool: Pool, member: Member, decision: RouteDecision, load: bool, movable: bool
    ) -> _Trip:
        if not load:
            return _Trip(member, None)
        flight = member.view.begin(decision.keys, decision.cached_blocks(member.address))
        self.shared.sent(pool.name, member.address, flight, movable=movable)
        return _Trip(member, flight)

    def _end(self, trip: _Trip) -> None:
        if trip.flight is not None:
            trip.member.view.end(trip.flight)
            self.shared.finished(trip.flight)

    async def _answer(
        self,
        response: Reply,
        trip: _Trip,
        promise: Promise,
        note: RouteNote,
        generates: bool,
        keep: Keep,
    ) -> Response:
        address = trip.member.address
        status = response.status
        stream = response.header(b"content-type").startswith(b"text/event-stream")
        if not stream and b"chunked" not in response.header(b"transfer-encoding").lower():
            try:
                body = await read_all(response)
            except BaseException:
                self._end(trip)
                raise
            kept = status == 200 and generates
            if kept:
                promise = promise.answered(answer_usage(body))
            note.promise = promise

            def after() -> None:
                # Once the client has the answer (nothing of it reads these), before any other
                # request of this process is served.
                self._end(trip)
                self.registry.refresh(address)
                self.router.metrics.requests_of[(address, "ok" if status < 500 else "failed")].inc()
                if kept:
                    keep(promise)

            return WholeAnswer(body, status, answer_headers(response), after)
        note.promise = promise
        if stream:
            watch = generates and status == 200

            def ended(promise: Promise, whole: bool) -> None:
                if whole:
                    self.router.metrics.requests_of[(address, "ok")].inc()
                self._end(trip)
                if watch:
                    keep(promise)

            body_iter = event_relay(response, promise, watch, ended)
        else:
            body_iter = chunk_relay(response, lambda: self._end(trip))
        out = StreamingResponse(body_iter, status_code=status)
        out.raw_headers = answer_headers(response)
        return out


def _kept_nowhere(promise: Promise) -> None:
    """The keeper of a request routed without ids: it promised nothing to compare."""
