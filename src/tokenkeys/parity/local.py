"""tokenkeys' side of a shape: the ids its render routes compute, by the same calls.

Each route's conversion and Preprocessor call, as ``frontend/routes_render.py``,
``routes_messages.py`` and ``routes_responses.py`` make them: ``tokenize_completion`` for a
completion, ``tokenize_chat`` for a conversation, after :func:`tokenkeys.preprocess.anthropic.
chat_body` for a Messages body and :func:`tokenkeys.preprocess.responses.to_chat_request` for a
Responses body. Nothing here tokenizes on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tokenkeys.preprocess import responses
from tokenkeys.preprocess.anthropic import chat_body
from tokenkeys.preprocess.preprocessor import Preprocessor


def _chat(pre: Preprocessor, body: Mapping[str, Any]) -> list[list[int]]:
    return [pre.tokenize_chat(body).tokens.ids]


_BY_ROUTE: dict[str, Callable[[Preprocessor, Mapping[str, Any]], list[list[int]]]] = {
    "completions": lambda pre, body: [t.ids for t in pre.tokenize_completion(body)],
    "chat": _chat,
    "messages": lambda pre, body: _chat(pre, chat_body(pre, body)),
    "responses": lambda pre, body: _chat(pre, responses.to_chat_request(body)),
}


def conversion(pre: Preprocessor, route: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The chat body tokenkeys renders for a Messages or Responses body (None for the others)."""
    if route == "messages":
        return chat_body(pre, body)
    if route == "responses":
        return responses.to_chat_request(body)
    return None


def served_ids(pre: Preprocessor, route: str, body: Mapping[str, Any]) -> list[list[int]]:
    """The prompts' ids tokenkeys serves for ``body`` on ``route`` (one list per prompt)."""
    return _BY_ROUTE[route](pre, body)
