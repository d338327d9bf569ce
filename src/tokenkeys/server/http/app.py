"""``create_app``: the OpenAI-compatible FastAPI app over a registry of served models."""

from __future__ import annotations

from fastapi import FastAPI

from tokenkeys import __version__
from tokenkeys.server.http import routes_generate, routes_system, routes_tokenize
from tokenkeys.server.http.config import HttpConfig
from tokenkeys.server.http.errors import install_error_handlers
from tokenkeys.server.http.metrics import HttpMetrics, MetricsMiddleware
from tokenkeys.server.http.openapi import install_openapi
from tokenkeys.server.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from tokenkeys.server.http.state import AppState
from tokenkeys.server.models import ModelRegistry

_DESCRIPTION = (
    "OpenAI-compatible frontend of tokenkeys. /tokenize reports the token count the generation "
    "routes produce for the same request (one Preprocessor per model serves both); what "
    "generation cannot do exactly answers 501 with the reason."
)


def create_app(models: ModelRegistry, config: HttpConfig | None = None) -> FastAPI:
    """The HTTP app serving ``models``.

    A model generates when ``model.extensions["engine"]`` holds an engine (an object with
    ``async generate(prompt_token_ids, params, context)`` like
    :meth:`tokenkeys.engine.core.Engine.generate`); without one its generation routes answer
    501 and /tokenize, /detokenize still work.
    """
    config = config or HttpConfig()
    app = FastAPI(
        title="tokenkeys",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.tokenkeys = AppState(models, config, HttpMetrics())
    install_error_handlers(app)
    routes_system.add_routes(app)
    routes_generate.add_routes(app)
    routes_tokenize.add_routes(app, config)
    install_openapi(
        app,
        [
            CompletionRequest,
            ChatCompletionRequest,
            TokenizeCompletionRequest,
            TokenizeChatRequest,
            DetokenizeRequest,
        ],
        _DESCRIPTION,
    )
    app.add_middleware(MetricsMiddleware, metrics=app.state.tokenkeys.metrics)
    return app
