"""``tokenkeys pull | prune``: fetch a served tokenizer into the local cache; drop old revisions."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tokenkeys.artifacts import ArtifactCache, ArtifactLimits, PullSettings, fetch
from tokenkeys.cli.access_options import add_client_access_options, channel_security
from tokenkeys.cli.limit_options import add_field_options, fields_from
from tokenkeys.cli.progress import ProgressBar, human_bytes
from tokenkeys.terminal import printable

#: What each of :class:`ArtifactLimits`' caps refuses, for its option's help.
_LIMIT_HELP = {
    "max_file_bytes": "refuse a file larger than this",
    "max_total_bytes": "refuse a tokenizer larger than this in total",
}


def register(sub: argparse._SubParsersAction) -> None:
    def cache_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--cache",
            type=Path,
            default=None,
            metavar="DIR",
            help="cache folder (default: $TOKENKEYS_CACHE, else ~/.cache/tokenkeys/tokenizers)",
        )

    p = sub.add_parser(
        "pull",
        help="fetch a served tokenizer into the local cache, verified",
        description="Fetch the tokenizer a server serves into <cache>/<fingerprint>/, checking "
        "every size and SHA-256 and the fingerprint before installing. Prints the folder.",
    )
    p.add_argument("target", metavar="HOST:PORT")
    p.add_argument("--model", default="", help="served model name (default: the server's first)")
    cache_option(p)
    p.add_argument(
        "--fingerprint",
        help="pin a revision: a cached one needs no call; a server serving another one fails",
    )
    p.add_argument("--chunk-size", type=int, metavar="BYTES", help="bytes per chunk to ask for")
    add_field_options(
        p, ArtifactLimits, _LIMIT_HELP, metavar="BYTES", shown=lambda n: f"{n // 2**20} MiB"
    )
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="deadline for the whole pull")
    p.add_argument(
        "--no-load",
        action="store_true",
        help="skip loading the tokenizer (which proves this host reproduces the fingerprint)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_client_access_options(p)
    p.set_defaults(func=run_pull)

    p = sub.add_parser(
        "prune",
        help="remove old tokenizer revisions from the local cache",
        description="Per served model name, keep the most recently used revisions and remove "
        "the others (and leftovers of dead transfers).",
    )
    cache_option(p)
    p.add_argument(
        "--keep-latest",
        type=int,
        default=1,
        metavar="N",
        help="revisions to keep per served model name (default 1)",
    )
    p.add_argument(
        "--keep", action="append", default=[], metavar="FINGERPRINT", help="never remove this one"
    )
    p.add_argument(
        "--all", dest="everything", action="store_true", help="remove every entry but --keep"
    )
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_prune)


def run_pull(args: argparse.Namespace) -> int:
    settings = PullSettings(
        chunk_size=args.chunk_size,
        limits=fields_from(args, ArtifactLimits),
        timeout=args.timeout,
        security=channel_security(args),
    )
    bar = ProgressBar(sys.stderr)
    started = time.monotonic()
    try:
        installed = fetch(
            args.target,
            model=args.model,
            fingerprint=args.fingerprint,
            cache=args.cache,
            settings=settings,
            progress=bar,
        )
    except KeyboardInterrupt:
        bar.close()
        where = (
            f"at {bar.last.path} ({bar.last.done} of {bar.last.total} bytes)"
            if bar.last
            else "before any data arrived"
        )
        print(
            f"tokenkeys pull: interrupted {printable(where)}; nothing was installed",
            file=sys.stderr,
        )
        return 130
    finally:
        bar.close()
    if not args.no_load:
        installed.load()
    seconds = time.monotonic() - started
    if args.json:
        print(
            json.dumps(
                {
                    "fingerprint": installed.fingerprint,
                    "path": str(installed.path),
                    "transferred": installed.transferred,
                    "from_cache": installed.from_cache,
                    "seconds": round(seconds, 3),
                }
            )
        )
    else:
        print(installed.path)
    if bar.enabled:
        how = (
            "already cached, nothing transferred"
            if installed.from_cache
            else f"{human_bytes(installed.transferred)} in {seconds:.2f} s"
        )
        print(f"{installed.fingerprint} ({how})", file=sys.stderr)
    return 0


def run_prune(args: argparse.Namespace) -> int:
    cache = ArtifactCache(args.cache)
    removed = cache.prune(
        keep_latest=args.keep_latest,
        keep=args.keep,
        everything=args.everything,
        dry_run=args.dry_run,
    )
    kept = [e.fingerprint for e in cache.entries() if e.fingerprint not in removed]
    if args.json:
        print(json.dumps({"removed": removed, "kept": kept, "dry_run": args.dry_run}))
    else:
        verb = "would remove" if args.dry_run else "removed"
        for fp in removed:
            print(f"{verb} {fp}")
        for fp in kept:
            print(f"kept {fp}")
    return 0
