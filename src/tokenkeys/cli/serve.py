"""``tokenkeys serve``: load the tokenizers, then serve gRPC and HTTP until SIGTERM or SIGINT.

Shutdown drains: the first signal makes both servers refuse new calls (HTTP 503, gRPC
UNAVAILABLE; health checks still answer, reporting draining), ends KV-event subscriptions with
their terminal message, waits up to ``--shutdown-timeout`` seconds for the calls in flight
(streams included) to finish, then stops and exits 0. A second signal stops at once.

``--processes N`` serves from N processes sharing the ports (:mod:`tokenkeys.process.supervisor`);
generation must then be forwarded (``--engine``): a simulated engine per process would be N
engines, each with its own prefix cache and KV events, behind one address.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

from tokenkeys.cli.access_options import add_server_access_options, server_tls, server_tokens
from tokenkeys.cli.common import (
    add_key_spec_options,
    add_tokenizer_options,
    key_spec_options,
    local_models,
)
from tokenkeys.cli.connection_options import add_connection_options, connection_limits_from
from tokenkeys.cli.engine_options import add_engine_options, engine_config_from, tokenizer_only
from tokenkeys.cli.help import DefaultsFormatter, essentials_first
from tokenkeys.cli.limit_options import add_limit_options, limits_from
from tokenkeys.cli.log_options import add_log_options
from tokenkeys.cli.media_options import add_media_options
from tokenkeys.cli.run_options import add_run_options, check_run_options
from tokenkeys.cli.serve_http import add_http_options, chat_options, http_config
from tokenkeys.engine.config import new_instance_id
from tokenkeys.engine.registry import engine_kind
from tokenkeys.errors import ConfigError
from tokenkeys.keys.deployment import DEFAULT_PROFILE, build_spec
from tokenkeys.process.encode_lanes import (
    MAX_DEFAULT_THREADS,
    MAX_ENCODE_THREADS,
    encode_threads_for,
    set_encode_threads,
)
from tokenkeys.process.run import run_served
from tokenkeys.server.assembly import EngineServer, ServeConfig
from tokenkeys.serving.models import attach_tokenizer_only

log = logging.getLogger("tokenkeys.serve")

#: What a first ``serve`` needs, shown first in ``--help``.
ESSENTIAL_FLAGS = (
    "--model",
    "--served-model-name",
    "--engine",
    "--engine-kv-events",
    "--cache-key-profile",
    "--host",
    "--grpc-port",
    "--http-port",
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve tokenizers over gRPC and an OpenAI-compatible HTTP frontend",
        formatter_class=DefaultsFormatter,
    )
    add_tokenizer_options(p.add_argument_group("models and tokenizer behaviour"), many=True)
    faces = p.add_argument_group("gRPC and HTTP faces")
    faces.add_argument(
        "--host",
        default="127.0.0.1",
        help="address gRPC, HTTP and the KV-event sockets bind (default 127.0.0.1: this host "
        "only; 0.0.0.0 or :: to serve other hosts)",
    )
    faces.add_argument(
        "--grpc-port",
        type=int,
        default=50051,
        metavar="PORT",
        help="port of the gRPC services (default 50051; 0 picks a free one)",
    )
    faces.add_argument(
        "--vllm-engine-face",
        action="store_true",
        help="also serve smg's vllm.grpc.engine.VllmEngine on the gRPC port, so SGLang's gateway "
        "routes here as a gRPC vLLM worker (smg launch --worker-urls grpc://HOST:PORT): one "
        "model per server; needs the smg extra (pip install 'tokenkeys[smg]')",
    )
    faces.add_argument(
        "--artifact-chunk-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="default bytes per GetTokenizerArtifacts chunk (default 512 KiB; at most 4,128,768)",
    )
    add_http_options(faces)
    add_media_options(p)
    processes = p.add_argument_group("processes and shutdown")
    add_run_options(
        processes,
        in_flight="calls",
        processes="serve from N processes sharing the gRPC and HTTP ports (SO_REUSEPORT), one "
        "per core; needs --engine HOST:PORT or --engine none (the simulated engine's prefix "
        "cache and KV events live in one process); default 1",
    )
    processes.add_argument(
        "--encode-threads",
        type=int,
        default=None,
        metavar="N",
        help="threads per process that encode large requests off the event loop (default: the "
        "cores left per worker after its event loop's, at least 1, at most "
        f"{MAX_DEFAULT_THREADS})",
    )
    add_limit_options(p)
    add_connection_options(p)
    keys = p.add_argument_group("cache keys (the spec GetCacheKeySpec serves and the engine uses)")
    add_key_spec_options(
        keys,
        profile_flag="--cache-key-profile",
        default_profile=None,
        shown_default=f"{DEFAULT_PROFILE}; with --engine vllm+http://... the one of vLLM's "
        "hash algorithm and release",
    )
    add_engine_options(p)
    add_server_access_options(p)
    add_log_options(p, worker=False)
    essentials_first(p, *ESSENTIAL_FLAGS)
    p.set_defaults(func=run)


def check_workers(args: argparse.Namespace) -> None:
    """``--processes N``: a count in range, and generation that N processes can share."""
    check_run_options(args)
    workers = getattr(args, "processes", 1)
    if workers > 1 and args.engine is None:
        raise ConfigError(
            f"--processes {workers} needs --engine HOST:PORT or --engine none: the simulated "
            "engine keeps its "
            "prefix cache and KV events in its process, so N processes would be N engines "
            "behind one address. Run it as its own `tokenkeys serve` and forward to it, or "
            "serve with --processes 1",
            field="processes",
        )
    threads = getattr(args, "encode_threads", None)
    if threads is not None and not 1 <= threads <= MAX_ENCODE_THREADS:
        raise ConfigError(
            f"--encode-threads must be 1..{MAX_ENCODE_THREADS}, got {threads}",
            field="encode_threads",
        )


def serve_config(args: argparse.Namespace, *, reuse_port: bool = False) -> ServeConfig:
    """The serving configuration the options describe (checked before any model loads).

    ``reuse_port``: this process is one of several workers sharing the ports.
    """
    check_workers(args)
    limits = limits_from(args)
    tokens = server_tokens(args)
    # The spec before the tokenizers: a bad cache-key option stops the server before loading.
    # Without --cache-key-profile, the default (the sidecar adopts vLLM's at start instead).
    options = key_spec_options(args)
    spec = build_spec(dataclasses.replace(options, profile=options.profile or DEFAULT_PROFILE))
    engine = None if tokenizer_only(args) else engine_config_from(args)
    if spec is None and engine is not None and engine_kind(engine.kind).hosting == "streamed":
        # The simulated engine keys its prefix cache and events with a spec; serving none while
        # it publishes hashes of another would advertise hashes no router can reproduce.
        raise ConfigError(
            "--cache-key-profile none needs --engine HOST:PORT: the simulated engine hashes "
            "its prefix-cache blocks with a spec; name the profile it should use",
            field="cache-key-profile",
        )
    return ServeConfig(
        host=args.host,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        limits=limits,
        engine=engine,
        cache_keys=spec,
        http=http_config(args, limits, auth=tokens),
        tls=server_tls(args),
        tokens=tokens,
        auth_health=args.auth_health,
        reuse_port=reuse_port,
        connections=connection_limits_from(args),
        vllm_engine_face=args.vllm_engine_face,
    )


def _description(server: EngineServer) -> list[str]:
    """What the server serves and how, one line each (tests and operators read them)."""
    config = server.config
    lines = [
        f"serving {model.name} (fingerprint {model.tokenizer.fingerprint}, "
        f"backend {model.tokenizer.options.backend})"
        for model in server.models
    ]
    # The first model's spec: the sidecar's may be what vLLM reported rather than the options'.
    first = next(iter(server.models), None)
    spec = first.cache_keys.spec if first is not None and first.cache_keys else config.cache_keys
    if spec is not None:
        lines.append(
            f"cache keys: {spec.profile_id}, hash unit {spec.hash_unit}, root "
            f"{spec.root_derivation}, spec fingerprint {spec.fingerprint}"
        )
    else:
        lines.append("cache keys: no spec served (--cache-key-profile none)")
    if server.runtime is not None:
        lines += server.runtime.describe()
    else:
        lines.append("engine: none (tokenizer-only: render, tokenize, cache keys; no generation)")
    if config.tls is not None:
        mutual = ", client certificates required" if config.tls.mutual else ""
        lines.append(f"TLS on gRPC and HTTP{mutual}")
    if config.tokens is not None:
        exempt = "" if config.auth_health else " (health checks exempt)"
        source = config.tokens.source
        lines.append(f"bearer-token authentication on, tokens from {source}{exempt}")
    lines.append(f"gRPC listening on {config.host}:{server.grpc_port}")
    lines.append(f"HTTP listening on {config.host}:{server.http_port}")
    return lines


async def start_server(
    args: argparse.Namespace, reuse_port: bool
) -> tuple[EngineServer, list[str]]:
    """Build and start the server the options describe (a :data:`~tokenkeys.process.run.Start`)."""
    config = serve_config(args, reuse_port=reuse_port)
    set_encode_threads(args.encode_threads or encode_threads_for(args.processes))
    models = local_models(args, config.limits, chat_options(args))
    if config.engine is None:
        attach_tokenizer_only(models, args.max_model_len)
    server = await EngineServer(models, config).start()
    return server, _description(server)


def _check_once(args: argparse.Namespace) -> None:
    serve_config(args)
    # Per-process defaults fixed once, so every worker serves the same identity.
    args.instance_id = args.instance_id or new_instance_id()


def run(args: argparse.Namespace) -> int:
    ports = [("grpc_port", "--grpc-port"), ("http_port", "--http-port")]
    return run_served(start_server, args, ports, check=_check_once)
