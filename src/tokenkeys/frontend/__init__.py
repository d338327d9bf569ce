"""The OpenAI-compatible HTTP frontend: generation, /tokenize and /detokenize on one Preprocessor.

Modules: ``app`` (:func:`create_app`), ``config`` (:class:`HttpConfig`, path settings),
``schemas`` (request and response shapes, vLLM-compatible), ``body`` (JSON in and out),
``errors`` (OpenAI error bodies), ``routes_tokenize``, ``routes_generate``, ``routes_system``,
``sampling`` (what generation honours), ``generation`` (driving a model's engine),
``streaming`` (SSE and incremental detokenization), ``metrics`` (Prometheus), ``openapi`` and
``server`` (uvicorn inside the caller's event loop).
"""

from tokenkeys.frontend.app import create_app
from tokenkeys.frontend.config import HttpConfig
from tokenkeys.frontend.server import HttpServer, start_http_server

__all__ = ["HttpConfig", "HttpServer", "create_app", "start_http_server"]
