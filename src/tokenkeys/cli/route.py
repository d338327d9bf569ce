"""``tokenkeys route``: an OpenAI-compatible HTTP router in front of OpenEngine workers.

``--processes N`` routes from N processes sharing the HTTP port
(:mod:`tokenkeys.process.supervisor`). Each is a whole router replica: it discovers the
engines, follows their KV events into its own prefix index (or the shared Redis one) and counts
its own requests in flight, as N router replicas behind a load balancer would.
"""

from __future__ import annotations

import argparse
import logging

from tokenkeys.cli.access_options import (
    add_client_access_options,
    add_server_access_options,
    channel_security,
    server_tls,
    server_tokens,
)
from tokenkeys.cli.connection_options import add_connection_options, connection_limits_from
from tokenkeys.cli.help import DefaultsFormatter, essentials_first
from tokenkeys.cli.log_options import add_log_options
from tokenkeys.cli.media_options import add_media_options, image_options
from tokenkeys.cli.run_options import add_run_options, check_run_options
from tokenkeys.cli.serve_http import http_config
from tokenkeys.limits import Limits
from tokenkeys.process.run import run_served
from tokenkeys.router.assembly import RouterProcess, RouterProcessConfig
from tokenkeys.router.index.memory import DEFAULT_CAPACITY
from tokenkeys.router.policy.cost import CostWeights
from tokenkeys.router.policy.router import POLICIES
from tokenkeys.router.service import INDEXES, RoutingConfig
from tokenkeys.router.workers.health import DOWN_AFTER
from tokenkeys.router.workers.pool_setup import PoolSettings
from tokenkeys.terminal import printable

log = logging.getLogger("tokenkeys.route")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "route",
        help="route OpenAI requests to the worker holding their prefix (precise prefix routing)",
        description="Discover the workers, pull their tokenizer, follow their KV events, and "
        "forward each /v1/completions and /v1/chat/completions request (tokenized once, as "
        "token ids) to the worker that caches the longest prefix of it.",
        formatter_class=DefaultsFormatter,
    )
    workers = p.add_argument_group("workers and discovery")
    workers.add_argument(
        "--worker",
        action="append",
        required=True,
        metavar="HOST:PORT[,URL]",
        help="an engine's OpenEngine gRPC address (repeat for each worker); OpenAI requests "
        "are forwarded to the HTTP frontend it advertises, or to URL when given "
        "(e.g. 10.0.0.7:50051,http://10.0.0.7:8000; required)",
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="precise",
        help="how a worker is chosen: precise (longest cached prefix and load, the cost below), "
        "or the others listed (default precise; see docs/router.md)",
    )
    index = p.add_argument_group("prefix index")
    index.add_argument(
        "--index", choices=INDEXES, default="memory", help="prefix index backend (default memory)"
    )
    index.add_argument(
        "--redis-url", metavar="URL", help="Redis of --index redis (redis://HOST:PORT)"
    )
    index.add_argument(
        "--redis-namespace",
        default="tokenkeys",
        help="key namespace in Redis; router replicas sharing an index use the same one",
    )
    index.add_argument(
        "--share-load",
        action="store_true",
        help="share requests in flight and cache growth with the other router replicas "
        "through --redis-url (default: each replica counts only its own)",
    )
    index.add_argument(
        "--no-replica-reconcile",
        dest="replica_reconcile",
        action="store_false",
        help="with --share-load: leave a request where it was sent when a peer placed the "
        "same new prompt on another worker at the same instant (default: the later copy moves "
        "to the earlier's worker before its first output)",
    )
    index.add_argument(
        "--index-capacity",
        type=int,
        default=DEFAULT_CAPACITY,
        metavar="KEYS",
        help=f"block keys the in-memory index keeps, LRU (default {DEFAULT_CAPACITY:,})",
    )
    workers.add_argument(
        "--events",
        choices=("auto", "zmq", "grpc"),
        default="auto",
        help="KV-event transport to follow (auto: ZMQ when a worker advertises it, else gRPC)",
    )
    cost = p.add_argument_group(
        "precise policy cost (in KV blocks; lower wins; see docs/router.md)",
        "cost = prefix weight x blocks to prefill + load weight x (KV blocks in use + "
        "prefill queued) + overflow weight x blocks beyond the KV capacity + growth weight x "
        "new blocks recently placed there",
    )
    d = CostWeights()
    for option, default, what in (
        ("--prefix-weight", d.prefix, "cost of one block of prefill; higher keeps prompts with "
         "their cached prefix, 0 ignores the cache"),
        ("--load-weight", d.load, "cost of one block of load (KV block in use, block of "
         "prefill queued); higher spreads running work at the price of more prefill, 1 is "
         "Dynamo's"),
        ("--overflow-weight", d.overflow, "cost of one block a request needs beyond the "
         "worker's KV capacity; higher moves requests off full workers sooner"),
        ("--growth-weight", d.growth, "cost of one block of new cache recently placed on the "
         "worker; higher spreads new prefixes, 0 lets a shared header attract them"),
        ("--router-temperature", d.temperature, "0 always takes the cheapest worker; above 0 "
         "samples workers, cheaper ones more often"),
        ("--replica-slack", d.replica_slack, "with --share-load: among the workers at most "
         "this many prompts' worth dearer than the cheapest, the one caching most of the prompt "
         "takes it; with --no-replica-reconcile a prompt cached nowhere goes to the "
         "rendezvous-hash worker of its first block (router replicas then agree on it without "
         "talking; reconciling replicas send it to the cheapest and undo a split after); 0 "
         "always takes the cheapest"),
    ):  # fmt: skip
        cost.add_argument(
            option, type=float, default=default, metavar="X", help=f"{what} (default {default})"
        )
    workers.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between two GetLoad polls of each worker (default 1)",
    )
    workers.add_argument(
        "--timeout",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="deadline of each discovery and GetLoad call to a worker (default 2)",
    )
    workers.add_argument(
        "--down-after",
        type=int,
        default=DOWN_AFTER,
        metavar="POLLS",
        help="GetLoad polls in a row a reachable worker may leave unanswered within --timeout "
        f"before it is marked down (default {DOWN_AFTER}); a refused connection is down at once",
    )
    workers.add_argument(
        "--cache",
        metavar="DIR",
        help="tokenizer cache folder (default: $TOKENKEYS_CACHE, else "
        "~/.cache/tokenkeys/tokenizers)",
    )
    face = p.add_argument_group("HTTP face")
    face.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    face.add_argument(
        "--http-port",
        type=int,
        default=8000,
        metavar="PORT",
        help="HTTP port (default 8000; 0 picks one)",
    )
    face.add_argument(
        "--max-request-bytes",
        type=int,
        default=Limits.max_request_bytes,
        metavar="N",
        help=f"bytes of one HTTP body, 413 above (default {Limits.max_request_bytes})",
    )
    face.add_argument("--tokenize-path", help="path of /tokenize (default /tokenize)")
    face.add_argument("--detokenize-path", help="path of /detokenize (default /detokenize)")
    add_run_options(
        p.add_argument_group("processes and shutdown"),
        in_flight="requests",
        processes="route from N processes sharing the HTTP port (SO_REUSEPORT), each a full "
        "router replica with its own index (or the shared --index redis); default 1",
    )
    add_media_options(p)
    add_connection_options(p, grpc=False)
    add_server_access_options(p, templates=False)
    add_client_access_options(p, prefix="worker-")
    add_log_options(p, worker=True)
    essentials_first(p, "--worker", "--policy", "--index", "--redis-url", "--host", "--http-port")
    p.set_defaults(func=run)


def config_from(args: argparse.Namespace, *, reuse_port: bool = False) -> RouterProcessConfig:
    """The router configuration the options describe (``reuse_port``: one of N workers)."""
    check_run_options(args)
    limits = Limits(max_request_bytes=args.max_request_bytes)
    router = RoutingConfig(
        workers=tuple(args.worker),
        policy=args.policy,
        index=args.index,
        redis_url=args.redis_url,
        redis_namespace=args.redis_namespace,
        index_capacity=args.index_capacity,
        share_load=args.share_load,
        reconcile=args.replica_reconcile,
        transport=args.events,
        poll_interval=args.poll_interval,
        timeout=args.timeout,
        down_after=args.down_after,
        pools=PoolSettings(
            cache=args.cache,
            limits=limits,
            security=channel_security(args, prefix="worker-"),
            images=image_options(args),
        ),
        cost=CostWeights(
            prefix=args.prefix_weight,
            load=args.load_weight,
            overflow=args.overflow_weight,
            growth=args.growth_weight,
            temperature=args.router_temperature,
            replica_slack=args.replica_slack,
        ),
    )
    return RouterProcessConfig(
        router,
        host=args.host,
        http_port=args.http_port,
        http=http_config(args, limits, auth=server_tokens(args)),
        tls=server_tls(args),
        reuse_port=reuse_port,
        connections=connection_limits_from(args),
    )


def _description(server: RouterProcess) -> list[str]:
    """Workers, pools and where the router listens, one line each."""
    lines = []
    registry = server.service.registry
    for ws in registry.workers.values():
        line = f"worker {ws.address}: {ws.state}"
        if ws.engines:
            line += f" ({', '.join(sorted(ws.engines))})"
        for refusal in ws.refusals:
            line += f"; refused for {refusal.model} ({refusal.reason}): {refusal.message}"
        if ws.error:
            line += f"; {ws.error}"
        lines.append(printable(line))  # errors and names come from the workers
    for pool in registry.pools.values():
        decision = pool.strategy.decision
        lines.append(
            f"pool {pool.name}: tokenizer {pool.fingerprint[:16]}, keys {pool.spec.profile_id} "
            f"({decision.mode}: {decision.reason}), {pool.block_size}-token blocks"
        )
    config = server.config
    where = f"{config.host}:{server.http_port}"
    lines.append(f"routing ({config.router.policy}, {config.router.index} index) on HTTP {where}")
    lines.append(f"HTTP listening on {where}")
    return lines


async def start_server(
    args: argparse.Namespace, reuse_port: bool
) -> tuple[RouterProcess, list[str]]:
    """Build and start the router the options describe (a :data:`~tokenkeys.process.run.Start`)."""
    server = await RouterProcess(config_from(args, reuse_port=reuse_port)).start()
    return server, _description(server)


def run(args: argparse.Namespace) -> int:
    return run_served(start_server, args, [("http_port", "--http-port")], check=config_from)
