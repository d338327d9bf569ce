"""The image options of ``serve`` and ``route``: the engine's model id as vLLM hashes it, where
media may come from.

The names follow vLLM's (``--allowed-local-media-path``, ``--allowed-media-domains``); the
bounds of a fetch are tokenkeys' own (vLLM has a timeout only).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenkeys.errors import ConfigError
from tokenkeys.preprocess.images import DEFAULT_IMAGE_LIMIT, ImageOptions
from tokenkeys.preprocess.media.decode import DEFAULT_MAX_PIXELS
from tokenkeys.preprocess.media.fetch import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_REDIRECTS,
    DEFAULT_TIMEOUT,
    MediaPolicy,
)


def add_media_options(parser: argparse.ArgumentParser) -> None:
    """The image options group (models whose folder carries a multimodal processor)."""
    group = parser.add_argument_group(
        "images (models whose tokenizer folder carries processor_config.json)"
    )
    group.add_argument(
        "--mm-model-id",
        metavar="MODEL",
        help="the engine's --model argument exactly as given (vLLM hashes it with every image "
        "into the identifier its block keys carry); when not given, a sidecar (--engine "
        "vllm+URL) takes it from its vLLM's /v1/models root and a router from its workers'; "
        "given, theirs must agree; unknown, counts are exact and image prompts get no keys",
    )
    group.add_argument(
        "--allowed-local-media-path",
        type=Path,
        metavar="DIR",
        help="file: image URLs are read from inside this folder only (default: none allowed)",
    )
    group.add_argument(
        "--allowed-media-domains",
        nargs="+",
        default=[],
        metavar="HOST",
        help="http(s) image URLs only from these hosts (default: any public host)",
    )
    group.add_argument(
        "--allow-private-media-addresses",
        action="store_true",
        help="let image URLs reach private, loopback and link-local addresses",
    )
    group.add_argument(
        "--media-fetch-timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"connect and read timeout of an image fetch (default {DEFAULT_TIMEOUT:g}; the "
        "whole transfer gets twice that)",
    )
    group.add_argument(
        "--max-media-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help=f"largest image file accepted (default {DEFAULT_MAX_BYTES})",
    )
    group.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        metavar="N",
        help="largest image in pixels (vLLM's VLLM_MAX_IMAGE_PIXELS, default "
        f"{DEFAULT_MAX_PIXELS})",
    )
    group.add_argument(
        "--limit-images-per-prompt",
        type=int,
        default=DEFAULT_IMAGE_LIMIT,
        metavar="N",
        help="most images one prompt may carry (the engine's limit_mm_per_prompt image count; "
        f"default {DEFAULT_IMAGE_LIMIT}, vLLM's when it leaves the modality out)",
    )


def image_options(args: argparse.Namespace) -> ImageOptions:
    """The image options from the parsed arguments (defaults for commands without them)."""
    timeout = getattr(args, "media_fetch_timeout", DEFAULT_TIMEOUT)
    for name, value in (
        ("media-fetch-timeout", timeout),
        ("max-media-bytes", getattr(args, "max_media_bytes", DEFAULT_MAX_BYTES)),
    ):
        if value <= 0:
            raise ConfigError(f"--{name} must be positive, got {value}", field=name)
    local = getattr(args, "allowed_local_media_path", None)
    if local is not None and not local.is_dir():
        raise ConfigError(
            f"--allowed-local-media-path {local} is not a folder", field="allowed-local-media-path"
        )
    limit = getattr(args, "limit_images_per_prompt", DEFAULT_IMAGE_LIMIT)
    if limit is not None and limit < 0:
        raise ConfigError("--limit-images-per-prompt must be >= 0", field="limit-images-per-prompt")
    policy = MediaPolicy(
        allowed_local_media_path=local,
        allowed_media_domains=tuple(getattr(args, "allowed_media_domains", None) or ()),
        allow_private_addresses=bool(getattr(args, "allow_private_media_addresses", False)),
        connect_timeout=timeout,
        read_timeout=timeout,
        deadline=2 * timeout,
        max_bytes=getattr(args, "max_media_bytes", DEFAULT_MAX_BYTES),
        max_redirects=DEFAULT_MAX_REDIRECTS,
    )
    return ImageOptions(
        model_id=getattr(args, "mm_model_id", None),
        policy=policy,
        max_pixels=getattr(args, "max_image_pixels", DEFAULT_MAX_PIXELS),
        limit_per_prompt=limit,
    )
