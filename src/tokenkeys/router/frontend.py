"""The routing HTTP frontend: the OpenAI frontend of ``tokenkeys serve``, generating through routes.

Nothing of the frontend is rewritten here. :func:`create_router_app` hands
:func:`tokenkeys.frontend.create_app` a live view of the router's pools as served models
(:class:`PoolModels`): each pool's pulled tokenizer and its one Preprocessor tokenize every
request (so /tokenize, /detokenize and the generation routes agree, and answer locally), and its
engine is a :class:`~tokenkeys.router.routed_engine.RoutedEngine`, which routes the token ids
and forwards them to the chosen worker. Request schemas, error bodies, SSE streaming and usage
(``prompt_tokens_details.cached_tokens`` as the worker reported it) are the frontend's.

Added here: the ``x-tokenkeys-*`` response headers of each routed request
(:class:`RouteHeaders`), ``GET /router/workers`` (pools, members, refusals), ``POST
/router/route`` (where a completion or chat body would go, and why, without generating), and
the router's metrics on the app's ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import Response

from tokenkeys.frontend import HttpConfig, create_app
from tokenkeys.frontend.body import json_response
from tokenkeys.frontend.opening import open_request
from tokenkeys.frontend.routes_tokenize import tokenize_body
from tokenkeys.keys import Adapter
from tokenkeys.router.explain.causes import Explainer
from tokenkeys.router.explain.endpoint import explain
from tokenkeys.router.forwarding.adapters import request_context
from tokenkeys.router.forwarding.asgi import ForwardingApp, ServedRoute
from tokenkeys.router.forwarding.door import FrontDoor
from tokenkeys.router.forwarding.routes import FORWARDED, Prompt
from tokenkeys.router.headers import RouteHeaders
from tokenkeys.router.policy.decision import RouteDecision, RouteRequest
from tokenkeys.router.policy.router import Router
from tokenkeys.router.replicas.sharing import SharedLoad
from tokenkeys.router.routed_engine import RoutedEngine
from tokenkeys.router.workers.pool import Pool
from tokenkeys.router.workers.registry import WorkerRegistry
from tokenkeys.serving.lifecycle import Lifecycle
from tokenkeys.serving.models import ModelRegistry, ServedModel

#: The routing app: the frontend's, behind the forwarded routes' own layer when it forwards.
RouterApp = FastAPI | ForwardingApp


class PoolModels(ModelRegistry):
    """The router's pools as the frontend's served models, current as workers come and go."""

    def __init__(
        self,
        registry: WorkerRegistry,
        router: Router,
        shared: SharedLoad | None = None,
        adapters: Callable[[str], tuple[Adapter, ...]] | None = None,
    ) -> None:
        super().__init__()
        self._registry = registry
        self._router = router
        self._shared = shared
        self._adapters = adapters
        self._served: dict[str, tuple[Pool, ServedModel]] = {}

    def _model(self, pool: Pool) -> ServedModel:
        cached = self._served.get(pool.name)
        if cached is None or cached[0] is not pool:
            engine = RoutedEngine(
                self._router, self._registry, pool.name, self._shared, self._adapters
            )
            served = ServedModel(pool.name, pool.tokenizer, pool.preprocessor, engine=engine)
            cached = self._served[pool.name] = (pool, served)
        return cached[1]

    def add(self, model: ServedModel) -> None:
        raise TypeError("the router's models are its pools; workers add them")

    def get(self, name: str | None) -> ServedModel:
        """The pool of ``name`` as a served model (NotFound / Unavailable as the router says)."""
        return self._model(self._router.pool(name))

    @property
    def names(self) -> list[str]:
        return list(self._registry.pools)

    def __iter__(self) -> Iterator[ServedModel]:
        return iter([self._model(p) for p in list(self._registry.pools.values())])


def create_router_app(
    registry: WorkerRegistry,
    router: Router,
    config: HttpConfig | None = None,
    *,
    metrics: CollectorRegistry | None = None,
    lifecycle: Lifecycle | None = None,
    shared: SharedLoad | None = None,
    door: FrontDoor | None = None,
    explainer: Explainer | None = None,
) -> RouterApp:
    """The OpenAI-compatible routing app; ``metrics`` (router, ingestion, index) is exported
    on ``/metrics`` beside the frontend's own; /health reports ``lifecycle`` (draining);
    ``shared`` tells the other router replicas what this one sends (``shared_load``);
    ``door`` forwards the routes of ``router.forwarding.routes`` to the workers' frontends,
    served by a :class:`ForwardingApp` in front of the app (without it every request generates
    over OpenEngine ``Generate``); ``explainer`` answers
    ``GET|POST /router/explain`` (``router.explain.endpoint``)."""
    adapters = door.adapters_of if door is not None else None
    app = create_app(PoolModels(registry, router, shared, adapters), config, lifecycle=lifecycle)
    if metrics is not None:
        app.state.tokenkeys.metrics.include(metrics)
    served = mount_forwarded(app, door) if door is not None else None

    async def workers(request: Request) -> Response:
        """Pools, their members and key strategy, every worker's state and refusals."""
        return json_response(registry.status())

    async def route(request: Request) -> Response:
        """The decision for a completion or chat body (its first prompt), not forwarded."""
        opened = await open_request(request)
        body, model = opened.body, opened.model
        context = request_context(opened)
        if door is None:
            tokens = await opened.run(tokenize_body, model, body, False)
            wanted = RouteRequest(tokens.ids, model.name, context)
        else:  # as the front door routes it, images keyed with the workers' model id
            pool = router.pool(model.name)
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            prompt = next(iter(await door.prompts(FORWARDED[path], opened, pool)), Prompt([]))
            workers = door.workers_for(pool, context)
            wanted = RouteRequest(prompt.ids, model.name, prompt.context(context), workers=workers)
        decision = await router.route(wanted, record=False)
        return json_response(decision_body(decision))

    app.add_api_route(
        "/router/workers",
        workers,
        methods=["GET"],
        summary="Pools, workers, their states and refusal reasons",
    )
    app.add_api_route(
        "/router/route",
        route,
        methods=["POST"],
        summary="Where a completion or chat request would be routed, and why (dry run)",
    )
    if explainer is not None:

        async def explained(request: Request) -> Response:
            """Per worker, the blocks of a request's prompt it holds and why not the next."""
            return await explain(request, router, explainer)

        app.add_api_route(
            "/router/explain",
            explained,
            methods=["GET", "POST"],
            summary="Why a request would miss the cache, per worker",
        )
    app.add_middleware(RouteHeaders)
    return ForwardingApp(app, served) if served is not None else app


def mount_forwarded(app: FastAPI, door: FrontDoor) -> dict[str, ServedRoute]:
    """Every forwarded route, served through ``door``; the frontend's own route of the same
    path (its documentation kept) serves the workers that have no HTTP frontend. The app's
    route of each path documents it in /openapi.json; :class:`ForwardingApp` serves it."""
    served = {}
    for path, forwarded in FORWARDED.items():
        own = next(
            (
                r
                for r in app.router.routes
                if isinstance(r, APIRoute) and r.path == path and "POST" in r.methods
            ),
            None,
        )
        if own is not None:
            app.router.routes.remove(own)
        handler = door.handler(forwarded, own.endpoint if own is not None else None)
        app.add_api_route(
            path,
            handler,
            methods=["POST"],
            summary=own.summary if own is not None else "Forwarded to the chosen worker",
            responses=own.responses if own is not None else None,
            openapi_extra=own.openapi_extra if own is not None else None,
            response_model=own.response_model if own is not None else None,
        )
        route = app.router.routes[-1]
        assert isinstance(route, APIRoute) and route.path == path
        served[path] = ServedRoute(route, handler)
    return served


def decision_body(decision: RouteDecision) -> dict[str, Any]:
    """A decision as JSON: the chosen worker, score, matched blocks, reason and the ranking
    (with each worker's cost under the precise policy, null under the baselines)."""
    return {
        "worker": decision.worker,
        "model": decision.model,
        "policy": decision.policy,
        "score": decision.score,
        "matched_blocks": decision.matched_blocks,
        "total_blocks": decision.total_blocks,
        "reason": decision.reason,
        "ranking": [
            {
                "worker": s.worker,
                "score": s.score,
                "matched_blocks": s.matched_blocks,
                "load": s.load,
                "cost": s.cost,
            }
            for s in decision.ranking
        ],
    }
