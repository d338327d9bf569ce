"""The engine's side of a shape: its render routes, else ``/tokenize``, over HTTP.

The render routes are vLLM 0.32's (``vllm/entrypoints/scale_out/render/api_router.py``; served
by ``vllm launch render``, by ``vllm serve --enable-scale-out`` and by ``tokenkeys serve``).
``vllm serve`` without ``--enable-scale-out`` answers them 403 and an engine without them 404:
then a conversation or a completion is counted by ``/tokenize`` (which takes the same prompt
options) and the result says so. A Messages or Responses shape is then checked in two parts:
the engine's ``/tokenize`` of tokenkeys' chat conversion (the template), and the engine's own
count of the request as sent (its conversion): ``/v1/messages/count_tokens``, or the
``usage.input_tokens`` of a one-token ``/v1/responses`` answer. Without a conversion to send it
is left unverified.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from tokenkeys.errors import ConfigError
from tokenkeys.preprocess.completion import prompts_of

RENDER = {
    "chat": "/v1/chat/completions/render",
    "completions": "/v1/completions/render",
    "messages": "/v1/messages/render",
    "responses": "/v1/responses/render",
}
TOKENIZE = "/tokenize"
#: Statuses meaning "this engine does not serve the route" (vLLM: 403 without scale-out).
ABSENT = (403, 404)
#: The engine's own count of a request as sent, per route without /tokenize of its own.
COUNT = {"messages": "/v1/messages/count_tokens", "responses": "/v1/responses"}
#: Fields of a chat body vLLM's ``TokenizeChatRequest`` reads.
_TOKENIZE_CHAT = (
    "model",
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
)


class EngineError(Exception):
    """The engine refused or did not answer a route; the message names engine and route."""


@dataclass(frozen=True)
class Fetched:
    """The engine's ids of one shape (one list per prompt) and where they came from."""

    ids: list[list[int]] | None
    source: str
    #: The engine's own prompt length for the request as sent (Messages and Responses without
    #: render routes), which ``ids`` (of tokenkeys' conversion) must also match.
    count: int | None = None


class LiveEngine:
    """An engine's HTTP API at ``base`` (``http://HOST:PORT``), each call bounded by ``timeout``."""

    def __init__(self, base: str, timeout: float) -> None:
        if not base.startswith(("http://", "https://")):
            raise ConfigError(f"--engine {base!r}: give an http://HOST:PORT URL", field="engine")
        if not timeout > 0:
            raise ConfigError(
                f"--timeout {timeout}: give a positive number of seconds", field="timeout"
            )
        self.base = base.rstrip("/")
        self._client = httpx.Client(base_url=self.base, timeout=timeout)
        #: Render routes found absent, with the status that said so.
        self._absent: dict[str, int] = {}

    def close(self) -> None:
        self._client.close()

    def _post(self, path: str, body: Mapping[str, Any]) -> httpx.Response:
        try:
            return self._client.post(path, json=body)
        except httpx.TimeoutException:
            raise EngineError(
                f"engine {self.base} {path}: no answer within {self._client.timeout.read} s"
            ) from None
        except httpx.HTTPError as exc:
            raise EngineError(f"engine {self.base} {path}: {exc}") from None

    def first_model(self) -> str:
        """The first model ``/v1/models`` lists (the name requests will carry)."""
        try:
            answer = self._client.get("/v1/models")
            answer.raise_for_status()
            return str(answer.json()["data"][0]["id"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise ConfigError(
                f"engine {self.base} /v1/models: cannot read a model name ({exc}); "
                "name it with --model",
                field="engine",
            ) from None

    def ids(
        self, route: str, body: Mapping[str, Any], conversion: Mapping[str, Any] | None = None
    ) -> Fetched:
        """The engine's ids for ``body`` on ``route``: rendered, else tokenized.

        ``conversion``: tokenkeys' chat conversion of a Messages or Responses body, tokenized
        by the engine when it has no render route (with the engine's own count of ``body``)."""
        path = RENDER[route]
        if path not in self._absent:
            answer = self._post(path, body)
            if answer.status_code not in ABSENT:
                rendered = _json(answer, self.base, path)
                items = rendered if isinstance(rendered, list) else [rendered]
                return Fetched([_ids_in(i, "token_ids", self.base, path) for i in items], path)
            self._absent[path] = answer.status_code
        why = f"{path} answered {self._absent[path]}"
        if route == "chat":
            chat = {k: body[k] for k in _TOKENIZE_CHAT if k in body}
            answer = _json(self._post(TOKENIZE, chat), self.base, TOKENIZE)
            return Fetched([_ids_in(answer, "tokens", self.base, TOKENIZE)], f"{TOKENIZE} ({why})")
        if route == "completions":
            one = {k: body[k] for k in ("model", "add_special_tokens") if k in body}
            out = []
            for prompt in prompts_of(body):  # /tokenize takes one prompt
                answer = self._post(TOKENIZE, {**one, "prompt": prompt})
                out.append(
                    _ids_in(_json(answer, self.base, TOKENIZE), "tokens", self.base, TOKENIZE)
                )
            return Fetched(out, f"{TOKENIZE} ({why})")
        if conversion is None:
            return Fetched(None, f"none ({why}; a {route} conversion has no other exact source)")
        chat = {k: conversion[k] for k in _TOKENIZE_CHAT if k in conversion}
        chat["chat_template_kwargs"] = _template_kwargs(conversion)
        answer = _json(self._post(TOKENIZE, chat), self.base, TOKENIZE)
        ids = _ids_in(answer, "tokens", self.base, TOKENIZE)
        count = self._count(route, body)
        source = f"{TOKENIZE} of tokenkeys' conversion and {COUNT[route]}'s count ({why})"
        return Fetched([ids], source, count)

    def _count(self, route: str, body: Mapping[str, Any]) -> int:
        """The engine's prompt length for ``body`` as sent (see the module doc)."""
        path = COUNT[route]
        if route == "messages":
            sent = {k: v for k, v in body.items() if k not in ("max_tokens", "stop_sequences")}
            return _int_in(_json(self._post(path, sent), self.base, path), ("input_tokens",), path)
        one = {**body, "max_output_tokens": 1, "temperature": 0, "stream": False, "store": False}
        answer = _json(self._post(path, one), self.base, path)
        return _int_in(answer, ("usage", "input_tokens"), path)


def _template_kwargs(chat: Mapping[str, Any]) -> dict[str, Any]:
    """The chat's template kwargs with ``reasoning_effort`` laid in as generation lays it
    (vLLM's /tokenize ignores the field itself): it also sets ``enable_thinking`` unless the
    kwargs do."""
    kwargs = dict(chat.get("chat_template_kwargs") or {})
    effort = chat.get("reasoning_effort")
    if effort is not None:
        kwargs.setdefault("reasoning_effort", effort)
        kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs


def _int_in(item: Any, keys: tuple[str, ...], path: str) -> int:
    for key in keys:
        item = item.get(key) if isinstance(item, dict) else None
    if not isinstance(item, int):
        raise EngineError(f"{path}: the answer has no {'.'.join(keys)} count")
    return item


def _json(answer: httpx.Response, base: str, path: str) -> Any:
    if answer.status_code != 200:
        try:
            message = answer.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = answer.text[:300]
        raise EngineError(f"engine {base} {path} answered {answer.status_code}: {message}")
    try:
        return answer.json()
    except ValueError:
        raise EngineError(f"engine {base} {path}: the answer is not JSON") from None


def _ids_in(item: Any, key: str, base: str, path: str) -> list[int]:
    ids = item.get(key) if isinstance(item, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise EngineError(f"engine {base} {path}: the answer has no {key} list of ids")
    return ids
