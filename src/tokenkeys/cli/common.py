"""Arguments shared by several subcommands: which tokenizer, with which behaviour options."""

from __future__ import annotations

import argparse

from tokenkeys.cli.media_options import image_options
from tokenkeys.errors import ConfigError
from tokenkeys.keys.deployment import (
    DEFAULT_BLOCK_SIZE,
    NO_PROFILE,
    KeySpecOptions,
)
from tokenkeys.limits import Limits
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.preprocess.incremental import (
    DEFAULT_MAX_BYTES,
    DEFAULT_VERIFY_EVERY,
    IncrementalOptions,
)
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import ModelRegistry
from tokenkeys.tokenizer import TokenizerOptions
from tokenkeys.tokenizer.options import BACKENDS


def add_tokenizer_options(parser: argparse._ActionsContainer, *, many: bool) -> None:
    """--model (repeatable for serve), --backend and the behaviour defaults."""
    parser.add_argument(
        "--model",
        action="append" if many else "store",
        default=[] if many else None,
        metavar="[NAME=]DIR",
        help="tokenizer folder to serve, optionally under NAME (an org/name id is fine; "
        "default: the embedded smollm2-135m-instruct)"
        + (" ; repeat to serve several" if many else ""),
    )
    if many:
        parser.add_argument(
            "--tokenize-cache-bytes",
            type=int,
            default=DEFAULT_MAX_BYTES,
            metavar="BYTES",
            help="byte budget of each model's exact incremental tokenization cache (default "
            f"{DEFAULT_MAX_BYTES >> 20} MiB; 0 turns it off); see docs/operating.md",
        )
        parser.add_argument(
            "--tokenize-cache-verify-every",
            type=int,
            default=DEFAULT_VERIFY_EVERY,
            metavar="N",
            help="re-encode 1 in N spliced texts whole and compare; a difference turns the "
            f"cache off for that model (default {DEFAULT_VERIFY_EVERY}; 0 never, 1 always)",
        )
        parser.add_argument(
            "--served-model-name",
            nargs="+",
            default=[],
            metavar="NAME",
            help="the names the model is served under, as vLLM's flag: requests may use any, "
            "answers carry the first (with one --model only)",
        )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="tokenizers",
        help="tokenizer library to reproduce: tokenizers (Rust frontends), transformers5 "
        "(vLLM 0.32 / transformers 5), transformers (installed); see docs/api.md",
    )
    parser.add_argument(
        "--nul",
        choices=("keep", "strip"),
        default="keep",
        help="NUL characters in text: keep them (vLLM) or strip them (Dynamo)",
    )
    parser.add_argument(
        "--no-completion-special-tokens",
        action="store_true",
        help="bare prompts default to add_special_tokens=false (Dynamo's /v1/completions)",
    )
    parser.add_argument(
        "--split-special-tokens",
        action="store_true",
        help="encode special-token text inside user text as plain text",
    )


def tokenizer_options(args: argparse.Namespace) -> TokenizerOptions:
    """Behaviour options from parsed arguments."""
    return TokenizerOptions(
        backend=args.backend,
        add_special_tokens_completion=not args.no_completion_special_tokens,
        nul=args.nul,
        split_special_tokens=args.split_special_tokens,
    )


def local_models(
    args: argparse.Namespace, limits: Limits | None = None, chat: ChatOptions | None = None
) -> ModelRegistry:
    """Load the models named by the arguments in this process, with the server chat settings."""
    specs = args.model if isinstance(args.model, list) else [args.model] if args.model else []
    sources = [ModelSource.parse(s) for s in specs]
    names = getattr(args, "served_model_name", None) or []
    if names:
        if len(sources) > 1:
            raise ConfigError(
                f"--served-model-name names one model, but {len(sources)} --model folders are "
                "served; name each one with --model NAME=DIR instead",
                field="served-model-name",
            )
        sources = [(sources[0] if sources else ModelSource.default()).named(names)]
    return load_models(
        sources,
        tokenizer_options(args),
        limits or Limits(),
        chat,
        artifact_chunk_size=getattr(args, "artifact_chunk_size", None),
        incremental=incremental_options(args),
        images=image_options(args),
    )


def incremental_options(args: argparse.Namespace) -> IncrementalOptions:
    """The tokenize cache's budget and guard rate (defaults for commands without the flags)."""
    return IncrementalOptions(
        max_bytes=getattr(args, "tokenize_cache_bytes", DEFAULT_MAX_BYTES),
        verify_every=getattr(args, "tokenize_cache_verify_every", DEFAULT_VERIFY_EVERY),
    )


def add_key_spec_options(
    parser: argparse._ActionsContainer,
    *,
    profile_flag: str,
    default_profile: str | None,
    shown_default: str | None = None,
) -> None:
    """The cache-key spec options (profile, block size, root, KV-cache groups);
    ``shown_default`` is how the help names the default when it is not ``default_profile``."""
    shown = shown_default or default_profile or "none; required"
    parser.add_argument(
        profile_flag,
        dest="key_profile",
        default=default_profile,
        metavar="ID",
        help=f"cache-key profile, e.g. vllm/sha256_cbor@0.31 (default: {shown}); "
        f"{NO_PROFILE!r} serves no spec; list them with tokenkeys keys --list",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        metavar="N",
        help=f"hash unit in tokens (default {DEFAULT_BLOCK_SIZE}, vLLM's default block size; "
        "with --kv-groups, the gcd of the group block sizes; with --engine vllm+http://..., "
        "the block size vLLM reports)",
    )
    root = parser.add_mutually_exclusive_group()
    root.add_argument(
        "--root-seed",
        metavar="S",
        help="the engine's hash seed string (vLLM: its PYTHONHASHSEED, e.g. 42; llm-d: hashSeed)",
    )
    root.add_argument(
        "--root-hex", metavar="H", help="explicit root bytes in hex, as the engine publishes them"
    )
    parser.add_argument(
        "--kv-groups",
        metavar="KIND:N,...",
        help="KV-cache groups of a hybrid model, e.g. sliding_window@64:32,full_attention:32",
    )


def key_spec_options(args: argparse.Namespace) -> KeySpecOptions:
    """The cache-key options of parsed arguments (see :func:`add_key_spec_options`)."""
    return KeySpecOptions(
        profile=args.key_profile,
        block_size=args.block_size,
        root_seed=args.root_seed,
        root_hex=args.root_hex,
        kv_groups=args.kv_groups,
    )
