"""The HTTP and chat options of ``tokenkeys serve``.

Chat options carry vLLM's flag names (``vllm serve --chat-template``,
``--trust-request-chat-template``, ``--default-chat-template-kwargs``,
``--chat-template-content-format``) with their meaning; they enter the tokenizer fingerprint
(:func:`tokenkeys.server.runtime.loading.chat_config_digest`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path

from tokenkeys.access.token import BearerTokens
from tokenkeys.cli.limit_options import render_limits_from
from tokenkeys.errors import ConfigError
from tokenkeys.frontend import HttpConfig
from tokenkeys.frontend.config import DETOKENIZE_PATH_ENV, TOKENIZE_PATH_ENV, resolve_paths
from tokenkeys.limits import Limits
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.server.runtime.loading import ModelSource
from tokenkeys.template.render import RenderLimits
from tokenkeys.tokenizer import TOKEN_STRS

# vLLM's load_chat_template treats a value with any of these characters as the template itself.
_TEMPLATE_CHARS = frozenset("{}\n")


def add_http_options(parser: argparse._ActionsContainer) -> None:
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
        "--token-strs",
        choices=TOKEN_STRS,
        default="decoded",
        help="how /tokenize spells token_strs: each token's decoded text (' world', default) or "
        "its vocabulary entry ('Ġworld', as vLLM); a request's token_strs_kind wins",
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


def allowed_template_dirs(args: argparse.Namespace) -> list[Path]:
    """Folders ``--chat-template`` files may come from: ``--allowed-template-dir`` if given,
    else the current directory and the served tokenizer folders."""
    given = list(getattr(args, "allowed_template_dir", None) or [])
    if given:
        return given
    models = args.model if isinstance(args.model, list) else [args.model] if args.model else []
    folders = [ModelSource.parse(m).path for m in models] or [ModelSource.default().path]
    return [Path.cwd(), *folders]


def _inside(path: Path, folders: list[Path]) -> bool:
    for folder in folders:
        try:
            path.relative_to(folder.resolve())
        except (ValueError, OSError):
            continue
        return True
    return False


def load_chat_template(value: str, allowed: list[Path] | None = None) -> str:
    """The text of ``--chat-template``: a file's contents, or the value if it is a template.

    A file must lie, symbolic links resolved, inside one of the ``allowed`` folders (default:
    the current directory): /tokenizer_info serves the template text, so reading any file the
    server can read would publish it.
    """
    path = Path(value)
    try:
        if path.is_file():
            real = path.resolve(strict=True)
            folders = allowed if allowed is not None else [Path.cwd()]
            if not _inside(real, folders):
                raise ConfigError(
                    f"--chat-template {value}: {real} is outside the folders templates may be "
                    f"read from ({', '.join(str(f) for f in folders)}); move it there or add its "
                    "folder with --allowed-template-dir",
                    field="chat_template",
                )
            return real.read_text(encoding="utf-8")
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
    # Namespaces built by hand (tests, other commands) may lack the render limit options.
    limits = render_limits_from(args) if hasattr(args, "render_max_output_chars") else None
    template = None
    if args.chat_template:
        template = load_chat_template(args.chat_template, allowed_template_dirs(args))
    return ChatOptions(
        chat_template=template,
        default_chat_template_kwargs=defaults,  # type: ignore[arg-type]  # checked by ChatOptions
        trust_request_chat_template=args.trust_request_chat_template,
        content_format=args.chat_template_content_format,
        limits=limits or RenderLimits(),
    )


def http_config(
    args: argparse.Namespace,
    limits: Limits,
    environ: Mapping[str, str] = os.environ,
    auth: BearerTokens | None = None,
) -> HttpConfig:
    """The HTTP settings: paths from the flags, else the environment, else the defaults."""
    tokenize_path, detokenize_path = resolve_paths(
        args.tokenize_path, args.detokenize_path, environ
    )
    return HttpConfig(
        tokenize_path=tokenize_path,
        detokenize_path=detokenize_path,
        limits=limits,
        auth=auth,
        auth_health=bool(getattr(args, "auth_health", False)),
        token_strs=getattr(args, "token_strs", "decoded"),
        access_log=bool(getattr(args, "access_log", False)),
    )
