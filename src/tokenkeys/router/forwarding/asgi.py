"""The forwarded routes' one ASGI layer, in front of the frontend's app.

Through the frontend's FastAPI app a forwarded request crossed ten layers before the front
door saw it (Starlette's and FastAPI's error, telemetry, body-limit and exception layers, the
route headers, the metrics, the guards, FastAPI's exit stack, the router's matching), and its
answer crossed them back: about a quarter of the router's CPU per request
(``bench/bench_front_door.py``, docs/benchmarks.md). :class:`ForwardingApp` serves the forwarded
POST routes itself and hands every other request to that app. For a forwarded request it does,
in one place and in the order those layers did, what each of them did:

1. a fresh route note, whose decisions become the ``x-tokenkeys-*`` headers of the answer
   (:mod:`tokenkeys.router.headers`);
2. the app's guards (:mod:`tokenkeys.frontend.guard`): a refusal is answered before the route
   is known, so it is counted and logged as ``unmatched``, as it was;
3. the route left in the scope, whose path labels the HTTP metrics and the access line;
4. the door's handler; an exception it raises is answered as the app's error handlers answer
   it (:func:`tokenkeys.frontend.errors.error_answer`), one raised once the answer began is
   left to the server, which closes the connection;
5. the HTTP metrics by route and status, timed to the end of the body (and of what a whole
   answer keeps once it is sent, ``answer.WholeAnswer``); the guards' hold released then.

The access log, when on, wraps this app from outside (``frontend.server.serve_app``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request

from tokenkeys.errors import TokenkeysError
from tokenkeys.frontend.access_log import route_label
from tokenkeys.frontend.errors import error_answer
from tokenkeys.frontend.guard import call_of, refusal
from tokenkeys.router.forwarding.door import Endpoint
from tokenkeys.router.headers import with_route_headers
from tokenkeys.router.routed_engine import RouteNote, current_note


@dataclass(frozen=True)
class ServedRoute:
    """One forwarded route: its handler, and the app's route that documents it (left in the
    scope, as the app's router leaves it)."""

    route: APIRoute
    endpoint: Endpoint


class ForwardingApp:
    """The router's HTTP app: ``served`` (by path) here, every other request by ``app``."""

    def __init__(self, app: FastAPI, served: dict[str, ServedRoute]) -> None:
        self.app = app
        #: The frontend app's state (settings, metrics, guards), which is this app's.
        self.state = app.state
        self._served = served
        #: The paths served here: the server answers their POSTs without uvicorn's cycle
        #: (``transport.direct_cycle``).
        self.direct_paths = frozenset(served)
        self._guards = app.state.tokenkeys.guards
        self._metrics = app.state.tokenkeys.metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        served = None
        if scope["type"] == "http" and scope["method"] == "POST":
            served = self._served.get(scope["path"])
        if served is None:
            await self.app(scope, receive, send)
        else:
            await self._serve(served, scope, receive, send)

    async def _serve(self, served: ServedRoute, scope: dict, receive: Any, send: Any) -> None:
        started = time.perf_counter()
        note = RouteNote()
        token = current_note.set(note)
        status = 500  # what the client gets if the handler fails before answering

        async def send_noted(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = with_route_headers(message, note)
            await send(message)

        try:
            try:
                release = self._guards.admit(call_of(scope))
            except TokenkeysError as error:
                await refusal(error)(scope, receive, send_noted)
                return
            try:
                scope["app"], scope["route"] = self.app, served.route
                request = Request(scope, receive)
                try:
                    response = await served.endpoint(request)
                except Exception as exc:  # noqa: BLE001 - answered as the app's handlers do
                    response = error_answer(exc, "POST", scope["path"])
                await response(scope, receive, send_noted)
            finally:
                release()
        finally:
            current_note.reset(token)
            self._metrics.record(route_label(scope), status, time.perf_counter() - started)
