"""``tokenkeys serve``: load the tokenizers, then serve gRPC and HTTP until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from tokenkeys._gen.openengine.v1 import tokenizer_pb2_grpc
from tokenkeys.cli.common import (
    add_key_spec_options,
    add_tokenizer_options,
    key_spec_options,
    local_models,
)
from tokenkeys.cli.engine_options import add_engine_options, engine_config_from
from tokenkeys.cli.serve_http import add_http_options, chat_options, http_config, start_http
from tokenkeys.errors import ConfigError
from tokenkeys.keys.deployment import DEFAULT_PROFILE, build_spec
from tokenkeys.limits import Limits
from tokenkeys.server.cache_key_service import attach_cache_keys
from tokenkeys.server.engine_runtime import EngineRuntime
from tokenkeys.server.engine_services import engine_service_adders
from tokenkeys.server.grpc_server import start_grpc_server
from tokenkeys.server.tokenizer_service import TokenizerService

log = logging.getLogger("tokenkeys.serve")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve tokenizers over gRPC and an OpenAI-compatible HTTP frontend"
    )
    add_tokenizer_options(p, many=True)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--grpc-port", type=int, default=50051)
    p.add_argument("--max-request-bytes", type=int, default=Limits.max_request_bytes)
    p.add_argument("--max-texts-per-request", type=int, default=Limits.max_texts_per_request)
    p.add_argument("--max-tokens-per-request", type=int, default=Limits.max_tokens_per_request)
    p.add_argument("--max-chars-per-text", type=int, default=Limits.max_chars_per_text)
    p.add_argument(
        "--artifact-chunk-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="default bytes per GetTokenizerArtifacts chunk (default 512 KiB; at most 4,128,768)",
    )
    keys = p.add_argument_group("cache keys (the spec GetCacheKeySpec serves and the engine uses)")
    add_key_spec_options(keys, profile_flag="--cache-key-profile", default_profile=DEFAULT_PROFILE)
    add_engine_options(p)
    add_http_options(p)
    p.set_defaults(func=run)


def limits_from(args: argparse.Namespace) -> Limits:
    return Limits(
        max_request_bytes=args.max_request_bytes,
        max_texts_per_request=args.max_texts_per_request,
        max_chars_per_text=args.max_chars_per_text,
        max_tokens_per_request=args.max_tokens_per_request,
    )


async def _serve(args: argparse.Namespace) -> int:
    limits = limits_from(args)
    http = http_config(args, limits)
    # The spec before the tokenizers: a bad cache-key option stops the server before loading.
    spec = build_spec(key_spec_options(args))
    engine_config = engine_config_from(args)
    if spec is None and engine_config.remote_engine is None:
        # The simulated engine keys its prefix cache and events with a spec; serving none while
        # it publishes hashes of another would advertise hashes no router can reproduce.
        raise ConfigError(
            "--cache-key-profile none needs --engine HOST:PORT: the simulated engine hashes "
            "its prefix-cache blocks with a spec; name the profile it should use",
            field="cache-key-profile",
        )
    models = local_models(args, limits, chat_options(args))
    # Every model gets the spec; the simulated engine keys its blocks with the same one
    # (local_engine.deployment_spec reads it from there).
    attach_cache_keys(models, spec, limits)
    service = TokenizerService(models)
    runtime = EngineRuntime(models, engine_config)
    server, port = await start_grpc_server(
        [
            lambda s: tokenizer_pb2_grpc.add_OpenEngineTokenizerServicer_to_server(service, s),
            *engine_service_adders(models, runtime),
        ],
        args.host,
        args.grpc_port,
        limits,
    )
    try:
        await runtime.start(args.host, port)
    except BaseException:
        await server.stop(None)
        raise
    for model in models:
        print(
            f"serving {model.name} (fingerprint {model.tokenizer.fingerprint}, "
            f"backend {model.tokenizer.options.backend})",
            flush=True,
        )
    if spec is not None:
        print(
            f"cache keys: {spec.profile_id}, hash unit {spec.hash_unit}, root "
            f"{spec.root_derivation}, spec fingerprint {spec.fingerprint}",
            flush=True,
        )
    else:
        print("cache keys: no spec served (--cache-key-profile none)", flush=True)
    for line in runtime.describe():
        print(line, flush=True)
    print(f"gRPC listening on {args.host}:{port}", flush=True)
    try:
        # After runtime.start: the engines are attached to the models by then.
        http_server = await start_http(args, models, http)
    except BaseException:
        await server.stop(grace=None)
        await runtime.close()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    runtime.begin_shutdown()  # KV-event subscribers get their terminal message during the grace
    await asyncio.gather(http_server.stop(), server.stop(grace=5.0))
    await runtime.close()
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    return asyncio.run(_serve(args))
