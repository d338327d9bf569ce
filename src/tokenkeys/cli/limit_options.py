"""Limit options: the request limits and chat template render limits of `serve`, and the
one-option-per-field helper `pull` declares its artifact caps with."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

from tokenkeys.errors import ConfigError
from tokenkeys.limits import Limits
from tokenkeys.template.render import RenderLimits

T = TypeVar("T")

_LIMIT_HELP = {
    "max_request_bytes": "bytes of one gRPC message or HTTP body (HTTP 413 / RESOURCE_EXHAUSTED)",
    "max_texts_per_request": "texts, prompts or id sequences in one request",
    "max_chars_per_text": "characters of one text, checked before encoding",
    "max_tokens_per_text": "tokens of one text or id sequence",
    "max_tokens_per_request": "tokens of one request, all texts together",
    "max_messages_per_conversation": "messages of one chat request",
    "max_streams_per_client": "streaming calls (gRPC streams, HTTP generations) one client "
    "address may hold at once, per transport; 0: no limit (HTTP 429 / RESOURCE_EXHAUSTED)",
}
_RENDER_OPTIONS = {
    "max_template_chars": ("--chat-template-max-chars", "characters of one chat template"),
    "max_output_chars": ("--chat-template-max-output-chars", "characters one render may output"),
    "max_built_chars": (
        "--chat-template-max-built-chars",
        "characters (and list items) one render may build in all, intermediate values "
        "included; bounds the memory a template can take",
    ),
    "max_range_items": ("--chat-template-max-range-items", "range() items of one render"),
    "max_render_seconds": ("--chat-template-max-render-seconds", "seconds one render may take"),
}


def add_field_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    limits: type[Any],
    helps: Mapping[str, str],
    *,
    metavar: str = "N",
    shown: Callable[[int], str] = str,
) -> None:
    """One integer option per field of the dataclass ``limits`` (``max_file_bytes`` is
    ``--max-file-bytes``), defaulting to the field's default; ``helps`` says what each field
    limits, ``shown`` how its default is written in the help. Read back by :func:`fields_from`."""
    for f in fields(limits):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=int,
            default=f.default,
            metavar=metavar,
            help=f"{helps[f.name]} (default {shown(f.default)})",
        )


def fields_from(args: argparse.Namespace, limits: type[T]) -> T:
    """The ``limits`` dataclass of parsed arguments registered by :func:`add_field_options`."""
    return limits(**{f.name: getattr(args, f.name) for f in fields(limits)})


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """Register the request limits and the chat template render limits."""
    g = parser.add_argument_group("limits (each refusal names the limit and its option)")
    add_field_options(g, Limits, _LIMIT_HELP)
    for f in fields(RenderLimits):
        if f.name not in _RENDER_OPTIONS:
            continue
        flag, text = _RENDER_OPTIONS[f.name]
        g.add_argument(
            flag,
            dest=f"render_{f.name}",
            type=float if f.name == "max_render_seconds" else int,
            default=f.default,
            metavar="N",
            help=f"{text} (default {f.default}; HTTP 413 / RESOURCE_EXHAUSTED beyond it)",
        )


def limits_from(args: argparse.Namespace) -> Limits:
    """The request limits of parsed arguments."""
    return fields_from(args, Limits)


def render_limits_from(args: argparse.Namespace) -> RenderLimits:
    """The chat template render limits of parsed arguments."""
    values = {name: getattr(args, f"render_{name}") for name in _RENDER_OPTIONS}
    try:
        return RenderLimits(**values)
    except ValueError as exc:
        raise ConfigError(f"chat template limits: {exc}", field="chat_template") from None
