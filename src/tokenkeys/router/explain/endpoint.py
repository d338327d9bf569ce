"""``GET|POST /router/explain`` and the ``x-tokenkeys-explain`` header of a routed request.

The endpoint takes ``{"route": PATH, "body": BODY}``: ``BODY`` is what would be sent to
``PATH``, one of the forwarded routes (``router.forwarding.routes``); ``route`` may instead be
given as the query parameter ``?route=PATH``, and defaults to ``/v1/chat/completions`` for a
body with ``messages``, else ``/v1/completions``. The body is opened exactly as that route
opens it (schema, checks, model; its 400s are the route's), its first prompt tokenized by the
pool's one Preprocessor, and the answer is the :class:`~tokenkeys.router.explain.causes.
Explanation` of that prompt, as JSON. Nothing is routed, forwarded or remembered.

A routed request with ``x-tokenkeys-explain: 1`` gets the part of the worker that answered,
as compact JSON in the ``x-tokenkeys-explain`` response header: taken when the request was
routed (before the worker stored anything of it), then, for an answer read whole, corrected by
the answer: a worker that served fewer cached tokens than promised is ``promised_not_served``
at the first block it did not serve. A streamed answer's header leaves before its usage, so it
carries the explanation at routing time only.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tokenkeys.errors import InvalidArgument
from tokenkeys.frontend.body import json_response, validate
from tokenkeys.frontend.opening import open_request
from tokenkeys.frontend.state import resolve_model
from tokenkeys.router.explain.causes import Explainer, WorkerExplanation
from tokenkeys.router.forwarding.adapters import request_context
from tokenkeys.router.forwarding.routes import FORWARDED
from tokenkeys.router.policy.router import Router

#: The request header asking for an explanation, and the response header answering it.
HEADER_EXPLAIN = "x-tokenkeys-explain"


_ASKING = HEADER_EXPLAIN.encode()


def asked(request: Request) -> bool:
    """The request asks for its explanation (``x-tokenkeys-explain: 1``).

    The first such header, as ``request.headers.get`` reads it, found in the scope's raw list:
    on every forwarded request the header is mostly absent, and Starlette's ``get`` raises and
    catches a KeyError to say so."""
    for name, value in request.scope["headers"]:
        if name == _ASKING:
            return value.decode("latin-1").strip() in ("1", "true")
    return False


async def explain(request: Request, router: Router, explainer: Explainer) -> Response:
    """The endpoint; see the module doc."""
    opened = await open_request(request)
    outer = opened.body
    inner = outer.get("body")
    if not isinstance(inner, dict):
        raise InvalidArgument(
            'body must be a JSON object: the request to explain, as in {"route": '
            '"/v1/chat/completions", "body": {"model": ..., "messages": [...]}}',
            field="body",
        )
    path = outer.get("route") or request.query_params.get("route")
    if path is None:
        path = "/v1/chat/completions" if "messages" in inner else "/v1/completions"
    route = FORWARDED.get(path) if isinstance(path, str) else None
    if route is None:
        raise InvalidArgument(
            f"route {path!r:.80} is not a routed path; use one of {', '.join(FORWARDED)}",
            field="route",
        )
    if route.schema is not None:
        validate(route.schema if isinstance(route.schema, type) else route.schema(inner), inner)
    if route.check is not None:
        route.check(inner)
    model, lora = resolve_model(opened.state.models, inner.get("model"))
    # The body as the route opens it: a model naming a LoRA adapter is its base model's pool,
    # keyed with the adapter (``cache_salt`` and adapter, as the front door keys it).
    asked_for = dataclasses.replace(opened, body=inner, model=model, lora=lora)
    pool = router.pool(model.name)
    prompts = await opened.run(route.prompts, model.preprocessor, inner)
    first = prompts[0]  # an image without its identifier: FailedPrecondition naming model_id
    found = await explainer.explain(pool, first.ids, first.context(request_context(asked_for)))
    return json_response({"route": path, **found.as_dict()})


def header_value(part: WorkerExplanation, promise: Any, prompt_blocks: int) -> bytes:
    """The ``x-tokenkeys-explain`` value: ``part`` corrected by the answer's ``promise``."""
    doc = {**part.as_dict(), "prompt_blocks": prompt_blocks}
    served = getattr(promise, "served_tokens", None)
    if served is not None and promise.over_promised:
        doc.update(
            first_missing_block=served // promise.block_size,
            cause="promised_not_served",
            detail={"expected_tokens": promise.expected_tokens, "served_tokens": served},
        )
    # ASCII: a header value is latin-1 on the wire.
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode()
