"""The forwarded routes: a path, how its body becomes the prompt ids routing decides on.

The router forwards a request whole, but decides where with the ids of the pool's one
Preprocessor, the same call the worker's frontend makes for that route. A route is forwarded
once it is registered here: a path, how its body becomes prompt ids on the pool's Preprocessor
(the conversion the worker's frontend makes, e.g. a Messages body into its chat request), and
the schema the worker's frontend opens it with.

``generates`` False makes the decision a dry one (render, count_tokens): the request is sent to
the best worker, but no load or cache growth is recorded for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenkeys.frontend.generation import with_images
from tokenkeys.frontend.opening import Schema
from tokenkeys.frontend.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    RenderChatRequest,
    RenderCompletionRequest,
    RenderResponsesRequest,
)
from tokenkeys.frontend.schemas_anthropic import CountTokensRequest, MessagesRequest
from tokenkeys.keys import KeyContext
from tokenkeys.preprocess import Preprocessor, anthropic, responses
from tokenkeys.preprocess.chat_schema import check_chat_request
from tokenkeys.preprocess.completion import refuse_empty_prompt
from tokenkeys.preprocess.images import MMFeature
from tokenkeys.preprocess.preprocessor import ChatTokenized


@dataclass(frozen=True)
class Prompt:
    """One prompt of a body as its worker builds it: the ids, and its images' features (vLLM's
    identifier and placeholder range of each, which its block keys carry)."""

    ids: list[int]
    features: tuple[MMFeature, ...] = ()

    @property
    def keyable(self) -> bool:
        """Every image has its identifier (the engine's model id is known): keys are exact."""
        return all(f.identifier is not None for f in self.features)

    def context(self, base: KeyContext | None) -> KeyContext | None:
        """``base`` with the prompt's image items, as the worker keys its blocks."""
        return with_images(base, self.features)


#: The prompts of a body, from the pool's Preprocessor.
Prompts = Callable[[Preprocessor, dict[str, Any]], list[Prompt]]


@dataclass(frozen=True)
class ForwardedRoute:
    """One POST route the router forwards; see the module doc.

    ``schema`` and ``check`` open the body as the worker's frontend does (its 400s are then the
    router's, word for word, before anything is sent).
    """

    path: str
    prompts: Prompts
    schema: Schema = None
    check: Callable[[dict[str, Any]], None] | None = None
    generates: bool = True


def _chat(rendered: ChatTokenized) -> list[Prompt]:
    return [Prompt(rendered.tokens.ids, rendered.features)]


def completion_prompts(preprocessor: Preprocessor, body: dict[str, Any]) -> list[Prompt]:
    """A completions body's prompts, as /v1/completions tokenizes them."""
    return [Prompt(p.ids) for p in preprocessor.tokenize_completion(body)]


def chat_prompts(preprocessor: Preprocessor, body: dict[str, Any]) -> list[Prompt]:
    """A chat body's one rendered prompt, as /v1/chat/completions tokenizes it."""
    return _chat(preprocessor.tokenize_chat(body))


def messages_prompts(preprocessor: Preprocessor, body: dict[str, Any]) -> list[Prompt]:
    """An Anthropic Messages body's prompt, as /v1/messages and its render tokenize it."""
    return _chat(preprocessor.tokenize_chat(anthropic.chat_body(preprocessor, body)))


def count_prompts(preprocessor: Preprocessor, body: dict[str, Any]) -> list[Prompt]:
    """A count_tokens body's prompt, as /v1/messages/count_tokens tokenizes it."""
    chat = anthropic.chat_body(preprocessor, body, count=True)
    return _chat(preprocessor.tokenize_chat(chat))


def responses_prompts(preprocessor: Preprocessor, body: dict[str, Any]) -> list[Prompt]:
    """A Responses body's prompt, as /v1/responses and its render tokenize it."""
    return _chat(preprocessor.tokenize_chat(responses.to_chat_request(body)))


#: Forwarded routes by path, in registration order.
FORWARDED: dict[str, ForwardedRoute] = {}


def register(route: ForwardedRoute) -> ForwardedRoute:
    """Forward ``route`` in every router app built from now on (a path registered twice is a
    bug: the second registration would silently win)."""
    if route.path in FORWARDED:
        raise ValueError(f"route {route.path!r} is already forwarded")
    FORWARDED[route.path] = route
    return route


register(
    ForwardedRoute("/v1/completions", completion_prompts, CompletionRequest, refuse_empty_prompt)
)
register(
    ForwardedRoute("/v1/chat/completions", chat_prompts, ChatCompletionRequest, check_chat_request)
)
register(
    ForwardedRoute(
        "/v1/completions/render", completion_prompts, RenderCompletionRequest, generates=False
    )
)
register(
    ForwardedRoute("/v1/chat/completions/render", chat_prompts, RenderChatRequest, generates=False)
)
register(ForwardedRoute("/v1/messages", messages_prompts, MessagesRequest))
register(ForwardedRoute("/v1/messages/render", messages_prompts, MessagesRequest, generates=False))
register(
    ForwardedRoute("/v1/messages/count_tokens", count_prompts, CountTokensRequest, generates=False)
)
register(ForwardedRoute("/v1/responses", responses_prompts, RenderResponsesRequest))
register(
    ForwardedRoute(
        "/v1/responses/render", responses_prompts, RenderResponsesRequest, generates=False
    )
)
