"""``tokenkeys serve`` limits: request sizes, per-client streams, chat template rendering."""

from __future__ import annotations

import argparse
from dataclasses import fields

from tokenkeys.errors import ConfigError
from tokenkeys.limits import Limits
from tokenkeys.template.render import RenderLimits

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


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """Register the request limits and the chat template render limits."""
    g = parser.add_argument_group("limits (each refusal names the limit and its option)")
    for f in fields(Limits):
        g.add_argument(
            "--" + f.name.replace("_", "-"),
            type=int,
            default=f.default,
            metavar="N",
            help=f"{_LIMIT_HELP[f.name]} (default {f.default})",
        )
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
    return Limits(**{f.name: getattr(args, f.name) for f in fields(Limits)})


def render_limits_from(args: argparse.Namespace) -> RenderLimits:
    """The chat template render limits of parsed arguments."""
    values = {name: getattr(args, f"render_{name}") for name in _RENDER_OPTIONS}
    try:
        return RenderLimits(**values)
    except ValueError as exc:
        raise ConfigError(f"chat template limits: {exc}", field="chat_template") from None
