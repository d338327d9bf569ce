"""/v1/models, /health, /version and /metrics."""

from __future__ import annotations

import time

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from tokenkeys import __version__
from tokenkeys.engine.fronted import FrontedEngine
from tokenkeys.frontend.body import json_response
from tokenkeys.frontend.metrics import CONTENT_TYPE
from tokenkeys.frontend.responses import ModelList
from tokenkeys.frontend.state import adapters_of, max_model_len_of, state_of
from tokenkeys.serving.models import ServedModel


def add_routes(app: FastAPI) -> None:
    """Mount the system routes."""
    created = int(time.time())

    async def models(request: Request) -> Response:
        """The served models, the default first, each of its names a card sharing one root,
        then LoRA adapters with their base as parent and their path as root (as vLLM 0.32 lists
        them: ``vllm/entrypoints/openai/models/serving.py``).

        vLLM's root is its ``--model`` argument, which it hashes into every image identifier;
        a model that takes images shows the one its images are hashed with (a sidecar's is its
        vLLM's), null while unknown, so a router in front keys image prompts as the engine
        does (``router.forwarding.image_ids``). Other models show their first name."""
        state = state_of(request)
        data = [
            _card(name, _root(m), None, max_model_len_of(m))
            for m in state.models
            for name in m.served_names
        ]
        for m in state.models:
            data += [_card(a.name, a.path, m.name, max_model_len_of(m)) for a in adapters_of(m)]
        return json_response({"object": "list", "data": data})

    def _root(model: ServedModel) -> str | None:
        pre = model.preprocessor
        return pre.images.model_id if pre.image_expander is not None else model.name

    def _card(name: str, root: str | None, parent: str | None, max_model_len: int) -> dict:
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "tokenkeys",
            "root": root,
            "parent": parent,
            "max_model_len": max_model_len,
        }

    async def health(request: Request) -> Response:
        """Readiness: 200 with an empty body while the server serves (as vLLM's /health); 503
        with ``{"status": "starting", "reason": ...}`` while its engines start (a sidecar
        waiting for its vLLM says what vLLM answered), ``{"status": "draining", "in_flight":
        N}`` while it shuts down, and with
        ``{"status": "engine_unavailable", "model": ..., "reason": ...}`` while a model's engine
        (a fronted vLLM) cannot serve."""
        state = state_of(request)
        lifecycle = state.lifecycle
        if lifecycle.draining:
            return json_response({"status": lifecycle.state, "in_flight": lifecycle.inflight}, 503)
        if lifecycle.starting is not None:
            return json_response({"status": "starting", "reason": lifecycle.starting}, 503)
        for model in state.models:
            if isinstance(model.engine, FrontedEngine):
                reason = await model.engine.unready()
                if reason is not None:
                    body = {"status": "engine_unavailable", "model": model.name, "reason": reason}
                    return json_response(body, 503)
        return Response(status_code=200)

    async def livez(request: Request) -> Response:
        """Liveness: 200 ``{"status": "alive", "state": ...}`` whenever the process answers,
        starting and draining included (a probe restarting it then would only lose time)."""
        return json_response({"status": "alive", "state": state_of(request).lifecycle.state})

    async def version(request: Request) -> Response:
        """``{"version": ...}`` as vLLM's /version answers: the release of the vLLM this server
        fronts (the first model's), else tokenkeys'; ``tokenkeys_version`` always."""
        releases = [
            m.engine.release
            for m in state_of(request).models
            if isinstance(m.engine, FrontedEngine) and m.engine.release
        ]
        return json_response(
            {"version": releases[0] if releases else __version__, "tokenkeys_version": __version__}
        )

    async def metrics(request: Request) -> Response:
        """Prometheus text exposition of this app's metrics."""
        return Response(state_of(request).metrics.render(), media_type=CONTENT_TYPE)

    app.add_api_route(
        "/v1/models", models, methods=["GET"], response_model=ModelList, summary="Served models"
    )
    app.add_api_route(
        "/health",
        health,
        methods=["GET"],
        summary="Readiness",
        responses={
            200: {"description": "serving", "content": {}},
            503: {
                "description": "starting (with the reason), draining (shutting down), or a "
                "model's engine is down"
            },
        },
    )
    app.add_api_route("/livez", livez, methods=["GET"], summary="Liveness")
    app.add_api_route("/version", version, methods=["GET"], summary="Versions")
    app.add_api_route(
        "/metrics",
        metrics,
        methods=["GET"],
        summary="Prometheus metrics",
        responses={200: {"description": "text exposition", "content": {"text/plain": {}}}},
    )
