"""``create_app``: the OpenAI-compatible FastAPI app over a registry of served models."""

from __future__ import annotations

from fastapi import FastAPI

from tokenkeys import __version__
from tokenkeys.frontend import (
    routes_derender,
    routes_generate,
    routes_messages,
    routes_render,
    routes_responses,
    routes_system,
    routes_tokenize,
)
from tokenkeys.frontend.config import HttpConfig
from tokenkeys.frontend.errors import install_error_handlers
from tokenkeys.frontend.guard import GuardMiddleware
from tokenkeys.frontend.metrics import HttpMetrics, MetricsMiddleware
from tokenkeys.frontend.openapi import install_openapi
from tokenkeys.frontend.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    RenderChatRequest,
    RenderCompletionRequest,
    RenderResponsesRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from tokenkeys.frontend.schemas_anthropic import CountTokensRequest, MessagesRequest
from tokenkeys.frontend.schemas_derender import DerenderChat, DerenderCompletion
from tokenkeys.frontend.state import AppState
from tokenkeys.preprocess.incremental.metrics import incremental_registry
from tokenkeys.serving.guards import Guards, build_guards
from tokenkeys.serving.lifecycle import Lifecycle
from tokenkeys.serving.models import ModelRegistry

_DESCRIPTION = (
    "OpenAI-compatible frontend of tokenkeys. /tokenize reports the token count the generation "
    "routes produce for the same request (one Preprocessor per model serves both); what "
    "generation cannot do exactly answers 501 with the reason."
)


def create_app(
    models: ModelRegistry,
    config: HttpConfig | None = None,
    *,
    lifecycle: Lifecycle | None = None,
    guards: Guards | None = None,
) -> FastAPI:
    """The HTTP app serving ``models``.

    Every request passes ``guards`` first (default: ``config.auth``, draining of
    ``lifecycle`` and ``config.limits.max_streams_per_client``); /health reports ``lifecycle``.

    A model generates when it has an ``engine`` (a :class:`tokenkeys.engine.protocol.Engine`);
    without one its generation routes answer 501 and /tokenize, /detokenize still work.
    """
    config = config or HttpConfig()
    lifecycle = lifecycle or Lifecycle()
    if guards is None:
        guards = build_guards(
            lifecycle, config.limits.max_streams_per_client, config.auth, config.auth_health
        )
    app = FastAPI(
        title="tokenkeys",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    metrics = HttpMetrics()
    # Every model's tokenize cache (the one Preprocessor's), read at each scrape.
    metrics.include(
        incremental_registry(
            lambda: [(m.name, m.preprocessor.encoder, m.preprocessor.history) for m in models]
        )
    )
    app.state.tokenkeys = AppState(models, config, metrics, lifecycle, guards)
    install_error_handlers(app)
    routes_system.add_routes(app)
    routes_generate.add_routes(app)
    routes_tokenize.add_routes(app, config)
    routes_render.add_routes(app)
    routes_messages.add_routes(app)
    routes_responses.add_routes(app)
    routes_derender.add_routes(app)
    install_openapi(
        app,
        [
            CompletionRequest,
            ChatCompletionRequest,
            TokenizeCompletionRequest,
            TokenizeChatRequest,
            DetokenizeRequest,
            RenderCompletionRequest,
            RenderChatRequest,
            MessagesRequest,
            CountTokensRequest,
            RenderResponsesRequest,
            DerenderCompletion,
            DerenderChat,
        ],
        _DESCRIPTION,
    )
    # Added last, runs first: refusals by the guards are counted in the metrics too.
    app.add_middleware(GuardMiddleware, guards=guards)
    app.add_middleware(MetricsMiddleware, metrics=app.state.tokenkeys.metrics)
    return app
