"""The HTTP and chat options of ``tokenkeys serve``, and starting the HTTP frontend.

Chat options carry vLLM's flag names (``vllm serve --chat-template``,
``--trust-request-chat-template``, ``--default-chat-template-kwargs``,
``--chat-template-content-format``) with their meaning; they enter the tokenizer fingerprint
(:func:`tokenkeys.server.loading.chat_config_digest`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path

from tokenkeys.chat import ChatOptions
from tokenkeys.errors import ConfigError
from tokenkeys.limits import Limits
from tokenkeys.server.http import HttpConfig, HttpServer, create_app, start_http_server
from tokenkeys.server.http.config import DETOKENIZE_PATH_ENV, TOKENIZE_PATH_ENV, resolve_paths
from tokenkeys.server.models import ModelRegistry

# vLLM's load_chat_template treats a value with any of these characters as the template itself.
_TEMPLATE_CHARS = frozenset("{}\n")


def add_http_options(parser: argparse.ArgumentParser) -> None:
    """--http-port, the chat template options and the tokenize paths."""
    parser.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="port of the OpenAI-compatible HTTP frontend (default 8000; 0 picks a free one)",
    )
    parser.add_argument(
        "--chat-template",
        metavar="FILE",
        help="chat template file (or template text) replacing every model's own",
    )
    parser.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="accept chat_template in requests (otherwise they are refused with 400)",
    )
    parser.add_argument(
        "--default-chat-template-kwargs",
        metavar="JSON",
        help="template variables every chat gets unless the request overrides them, e.g. "
        "'{\"enable_thinking\": false}'",
    )
    parser.add_argument(
        "--chat-template-content-format",
        choices=("auto", "string", "openai"),
        default="auto",
        help="how message content reaches the template (default: detected from the template)",
    )
    parser.add_argument(
        "--tokenize-path",
        help=f"path of /tokenize (default /tokenize, or ${TOKENIZE_PATH_ENV}; this flag wins)",
    )
    parser.add_argument(
        "--detokenize-path",
        help=f"path of /detokenize (default /detokenize, or ${DETOKENIZE_PATH_ENV}; this flag "
        "wins)",
    )


def load_chat_template(value: str) -> str:
    """The text of ``--chat-template``: a file's contents, or the value if it is a template."""
    path = Path(value)
    try:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--chat-template {value}: cannot read it: {exc}") from exc
    if _TEMPLATE_CHARS & set(value):
        return value
    raise ConfigError(
        f"--chat-template {value!r}: no such file; give a path to a .jinja file (or the "
        "template text itself)",
        field="chat_template",
    )


def chat_options(args: argparse.Namespace) -> ChatOptions:
    """Server chat settings from the parsed arguments."""
    defaults: object = {}
    if args.default_chat_template_kwargs:
        try:
            defaults = json.loads(args.default_chat_template_kwargs)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"--default-chat-template-kwargs is not valid JSON: {exc}",
                field="default_chat_template_kwargs",
            ) from None
    return ChatOptions(
        chat_template=load_chat_template(args.chat_template) if args.chat_template else None,
        default_chat_template_kwargs=defaults,  # type: ignore[arg-type]  # checked by ChatOptions
        trust_request_chat_template=args.trust_request_chat_template,
        content_format=args.chat_template_content_format,
    )


def http_config(
    args: argparse.Namespace, limits: Limits, environ: Mapping[str, str] = os.environ
) -> HttpConfig:
    """The HTTP settings: paths from the flags, else the environment, else the defaults."""
    tokenize_path, detokenize_path = resolve_paths(
        args.tokenize_path, args.detokenize_path, environ
    )
    return HttpConfig(tokenize_path=tokenize_path, detokenize_path=detokenize_path, limits=limits)


async def start_http(
    args: argparse.Namespace, models: ModelRegistry, config: HttpConfig
) -> HttpServer:
    """Start the HTTP frontend on ``--host``/``--http-port`` and print where it listens."""
    server = await start_http_server(create_app(models, config), args.host, args.http_port)
    print(f"HTTP listening on {args.host}:{server.port}", flush=True)
    return server
