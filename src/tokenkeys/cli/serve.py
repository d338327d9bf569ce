"""``tokenkeys serve``: load the tokenizers, then serve gRPC and HTTP until SIGTERM or SIGINT.

Shutdown drains: the first signal makes both servers refuse new calls (HTTP 503, gRPC
UNAVAILABLE; health checks still answer, reporting draining), ends KV-event subscriptions with
their terminal message, waits up to ``--shutdown-timeout`` seconds for the calls in flight
(streams included) to finish, then stops and exits 0. A second signal stops at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from tokenkeys._gen.openengine.v1 import tokenizer_pb2_grpc
from tokenkeys.cli.access_options import add_server_access_options, server_tls, server_tokens
from tokenkeys.cli.common import (
    add_key_spec_options,
    add_tokenizer_options,
    key_spec_options,
    local_models,
)
from tokenkeys.cli.connection_options import add_connection_options, connection_limits_from
from tokenkeys.cli.engine_options import add_engine_options, engine_config_from
from tokenkeys.cli.limit_options import add_limit_options, limits_from
from tokenkeys.cli.serve_http import add_http_options, chat_options, http_config, start_http
from tokenkeys.errors import ConfigError
from tokenkeys.keys.deployment import DEFAULT_PROFILE, build_spec
from tokenkeys.server.grpc.cache_keys import attach_cache_keys
from tokenkeys.server.grpc.engine_services import engine_service_adders
from tokenkeys.server.grpc.server import start_grpc_server
from tokenkeys.server.grpc.tokenizer import TokenizerService
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.serving.guards import build_guards
from tokenkeys.serving.lifecycle import Lifecycle
from tokenkeys.terminal import escape_log_records

log = logging.getLogger("tokenkeys.serve")

#: After the drain, what the servers still give the calls that outlived the deadline.
_STOP_GRACE = 1.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve tokenizers over gRPC and an OpenAI-compatible HTTP frontend"
    )
    add_tokenizer_options(p, many=True)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address gRPC, HTTP and the KV-event sockets bind (default 127.0.0.1: this host "
        "only; 0.0.0.0 or :: to serve other hosts)",
    )
    p.add_argument("--grpc-port", type=int, default=50051)
    p.add_argument(
        "--artifact-chunk-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="default bytes per GetTokenizerArtifacts chunk (default 512 KiB; at most 4,128,768)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long calls in flight may take to finish (default 30)",
    )
    add_limit_options(p)
    add_connection_options(p)
    keys = p.add_argument_group("cache keys (the spec GetCacheKeySpec serves and the engine uses)")
    add_key_spec_options(keys, profile_flag="--cache-key-profile", default_profile=DEFAULT_PROFILE)
    add_engine_options(p)
    add_http_options(p)
    add_server_access_options(p)
    p.set_defaults(func=run)


async def _serve(args: argparse.Namespace) -> int:
    if args.shutdown_timeout < 0:
        raise ConfigError("--shutdown-timeout must be >= 0", field="shutdown-timeout")
    limits = limits_from(args)
    connections = connection_limits_from(args)
    tls = server_tls(args)
    tokens = server_tokens(args)
    http = http_config(args, limits, auth=tokens)
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
    lifecycle = Lifecycle()
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
        guards=build_guards(lifecycle, limits.max_streams_per_client, tokens, args.auth_health),
        tls=tls,
        connections=connections,
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
    if tls is not None:
        mutual = ", client certificates required" if tls.mutual else ""
        print(f"TLS on gRPC and HTTP{mutual}", flush=True)
    if tokens is not None:
        exempt = "" if args.auth_health else " (health checks exempt)"
        print(f"bearer-token authentication on, tokens from {tokens.source}{exempt}", flush=True)
    print(f"gRPC listening on {args.host}:{port}", flush=True)
    try:
        # After runtime.start: the engines are attached to the models by then.
        http_server = await start_http(
            args, models, http, lifecycle=lifecycle, tls=tls, connections=connections
        )
    except BaseException:
        await server.stop(grace=None)
        await runtime.close()
        raise
    signals = asyncio.Queue[int]()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    received = await signals.get()
    print(
        f"{signal.Signals(received).name}: draining {lifecycle.inflight} calls in flight, "
        f"at most {args.shutdown_timeout:g} s",
        flush=True,
    )
    lifecycle.begin_drain()
    runtime.begin_shutdown()  # KV-event subscribers get their terminal message now
    drain = asyncio.ensure_future(lifecycle.wait_idle(args.shutdown_timeout))
    second = asyncio.ensure_future(signals.get())
    await asyncio.wait({drain, second}, return_when=asyncio.FIRST_COMPLETED)
    second.cancel()
    left = drain.result() if drain.done() else lifecycle.inflight
    drain.cancel()
    if left:
        print(f"stopping with {left} calls still in flight (deadline or second signal)", flush=True)
    grace = _STOP_GRACE if left else 0.0
    await asyncio.gather(http_server.stop(grace), server.stop(grace=grace))
    await runtime.close()
    print("stopped", flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    escape_log_records()  # log lines carry client- and server-supplied strings
    return asyncio.run(_serve(args))
