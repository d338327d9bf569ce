"""The opening step every model route shares: state, bounded body, validation, served model.

``tokenkeys serve`` and ``tokenkeys route`` mount the same routes (``route`` adds its own dry
run), and each begins here, so a body limit, a schema refusal or an unknown model answers the
same on every route and on both commands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request

from tokenkeys.frontend.body import parse_object, read_body, validate
from tokenkeys.frontend.state import AppState, preprocess, resolve_model, state_of
from tokenkeys.serving.models import ServedModel

T = TypeVar("T")

#: The schema a body is validated against: a model, or a function choosing one from the body.
Schema = type[BaseModel] | Callable[[dict[str, Any]], type[BaseModel]] | None


@dataclass(frozen=True)
class Opened:
    """One model request after its opening step."""

    state: AppState
    body: dict[str, Any]
    #: The body's size in bytes (large bodies are tokenized off the event loop).
    size: int
    model: ServedModel
    #: The LoRA adapter when the request named one (served by its base model).
    lora: str | None
    #: The body's bytes as the client sent them (what a router forwards).
    raw: bytes = b""

    async def run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """A Preprocessor call for this request (:func:`~tokenkeys.frontend.state.preprocess`)."""
        return await preprocess(self.state, self.size, fn, *args, **kw)


async def open_request(
    request: Request, schema: Schema = None, check: Callable[[dict], None] | None = None
) -> Opened:
    """Read the body (bounded), check it against ``schema`` (then ``check``, the engine's own
    request validators), find the model it names."""
    state = state_of(request)
    raw = await read_body(request, state.config.limits.max_request_bytes)
    body = parse_object(raw)
    if schema is not None:
        chosen = schema if isinstance(schema, type) else schema(body)
        validate(chosen, body)
    if check is not None:
        check(body)
    model, lora = resolve_model(state.models, body.get("model"))
    return Opened(state, body, len(raw), model, lora, raw)
