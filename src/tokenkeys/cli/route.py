"""``tokenkeys route``: an OpenAI-compatible HTTP router in front of OpenEngine workers."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from tokenkeys.cli.access_options import (
    add_client_access_options,
    add_server_access_options,
    channel_security,
    server_tls,
    server_tokens,
)
from tokenkeys.cli.connection_options import add_connection_options, connection_limits_from
from tokenkeys.cli.serve_http import http_config
from tokenkeys.frontend import start_http_server
from tokenkeys.limits import Limits
from tokenkeys.router.frontend import create_router_app
from tokenkeys.router.index.memory import DEFAULT_CAPACITY
from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.policy.router import POLICIES
from tokenkeys.router.service import INDEXES, RouterConfig, RoutingService
from tokenkeys.router.workers.pool_setup import PoolSettings
from tokenkeys.serving.lifecycle import Lifecycle
from tokenkeys.terminal import escape_log_records, printable

log = logging.getLogger("tokenkeys.route")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "route",
        help="route OpenAI requests to the worker holding their prefix (precise prefix routing)",
        description="Discover the workers, pull their tokenizer, follow their KV events, and "
        "forward each /v1/completions and /v1/chat/completions request (tokenized once, as "
        "token ids) to the worker that caches the longest prefix of it.",
    )
    p.add_argument(
        "--worker",
        action="append",
        required=True,
        metavar="HOST:PORT",
        help="an engine's OpenEngine gRPC address (repeat for each worker)",
    )
    p.add_argument("--policy", choices=POLICIES, default="precise")
    p.add_argument("--index", choices=INDEXES, default="memory", help="prefix index backend")
    p.add_argument("--redis-url", metavar="URL", help="Redis of --index redis (redis://HOST:PORT)")
    p.add_argument(
        "--redis-namespace",
        default="tokenkeys",
        help="key namespace in Redis; router replicas sharing an index use the same one",
    )
    p.add_argument(
        "--index-capacity",
        type=int,
        default=DEFAULT_CAPACITY,
        metavar="KEYS",
        help=f"block keys the in-memory index keeps, LRU (default {DEFAULT_CAPACITY:,})",
    )
    p.add_argument(
        "--events",
        choices=("auto", "zmq", "grpc"),
        default="auto",
        help="KV-event transport to follow (auto: ZMQ when a worker advertises it, else gRPC)",
    )
    cost = p.add_argument_group(
        "precise policy cost (in KV blocks; lower wins; see docs/router.md)",
        "cost = prefix weight x blocks to prefill + load weight x KV blocks in use "
        "+ growth weight x new blocks recently placed there",
    )
    d = CostWeights()
    for option, default, what in (
        ("--prefix-weight", d.prefix, "cost of one block of prefill; higher keeps prompts with "
         "their cached prefix, 0 ignores the cache"),
        ("--load-weight", d.load, "cost of one KV block in use; higher spreads running work at "
         "the price of more prefill"),
        ("--growth-weight", d.growth, "cost of one block of new cache recently placed on the "
         "worker; higher spreads new prefixes, 0 lets a shared header attract them"),
        ("--router-temperature", d.temperature, "0 always takes the cheapest worker; above 0 "
         "samples workers, cheaper ones more often"),
    ):  # fmt: skip
        cost.add_argument(
            option, type=float, default=default, metavar="X", help=f"{what} (default {default})"
        )
    p.add_argument("--poll-interval", type=float, default=1.0, metavar="SECONDS")
    p.add_argument("--timeout", type=float, default=2.0, metavar="SECONDS")
    p.add_argument(
        "--cache",
        metavar="DIR",
        help="tokenizer cache folder (default: $TOKENKEYS_CACHE, else "
        "~/.cache/tokenkeys/tokenizers)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--http-port", type=int, default=8000, help="HTTP port (default 8000; 0 picks one)"
    )
    p.add_argument("--max-request-bytes", type=int, default=Limits.max_request_bytes)
    p.add_argument("--tokenize-path", help="path of /tokenize (default /tokenize)")
    p.add_argument("--detokenize-path", help="path of /detokenize (default /detokenize)")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long requests in flight may take to finish (default 30)",
    )
    add_connection_options(p, grpc=False)
    add_server_access_options(p, templates=False)
    add_client_access_options(p, prefix="worker-")
    p.set_defaults(func=run)


def config_from(args: argparse.Namespace) -> RouterConfig:
    """The router configuration the options describe."""
    limits = Limits(max_request_bytes=args.max_request_bytes)
    return RouterConfig(
        workers=tuple(args.worker),
        policy=args.policy,
        index=args.index,
        redis_url=args.redis_url,
        redis_namespace=args.redis_namespace,
        index_capacity=args.index_capacity,
        transport=args.events,
        poll_interval=args.poll_interval,
        timeout=args.timeout,
        pools=PoolSettings(
            cache=args.cache, limits=limits, security=channel_security(args, prefix="worker-")
        ),
        cost=CostWeights(
            prefix=args.prefix_weight,
            load=args.load_weight,
            growth=args.growth_weight,
            temperature=args.router_temperature,
        ),
    )


async def _route(args: argparse.Namespace) -> int:
    config = config_from(args)
    tls = server_tls(args)
    tokens = server_tokens(args)
    http = http_config(args, config.pools.limits, auth=tokens)
    lifecycle = Lifecycle()
    service = await RoutingService(config).start()
    try:
        for ws in service.registry.workers.values():
            line = f"worker {ws.address}: {ws.state}"
            if ws.engines:
                line += f" ({', '.join(sorted(ws.engines))})"
            for refusal in ws.refusals:
                line += f"; refused for {refusal.model} ({refusal.reason}): {refusal.message}"
            if ws.error:
                line += f"; {ws.error}"
            print(printable(line), flush=True)  # errors and names come from the workers
        for pool in service.registry.pools.values():
            decision = pool.strategy.decision
            print(
                f"pool {pool.name}: tokenizer {pool.fingerprint[:16]}, keys {pool.spec.profile_id} "
                f"({decision.mode}: {decision.reason}), {pool.block_size}-token blocks",
                flush=True,
            )
        app = create_router_app(
            service.registry,
            service.router,
            http,
            metrics=service.metrics_registry,
            lifecycle=lifecycle,
        )
        server = await start_http_server(
            app, args.host, args.http_port, tls=tls, connections=connection_limits_from(args)
        )
    except BaseException:
        await service.close()
        raise
    print(
        f"routing ({config.policy}, {config.index} index) on HTTP {args.host}:{server.port}",
        flush=True,
    )
    print(f"HTTP listening on {args.host}:{server.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # Drain as tokenkeys serve does: new requests 503, /health draining, in-flight ones finish.
    lifecycle.begin_drain()
    left = await lifecycle.wait_idle(args.shutdown_timeout)
    await server.stop(1.0 if left else 0.0)
    await service.close()
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    escape_log_records()  # log lines carry client- and server-supplied strings
    return asyncio.run(_route(args))
