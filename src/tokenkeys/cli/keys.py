"""``tokenkeys keys`` (list profiles, compute block keys) and ``tokenkeys vectors``.

``keys`` builds one ``ComputeCacheKeysRequest`` and answers it through the same code as the
server's ComputeCacheKeys: in process (:meth:`CacheKeyService.compute_now`) or, with
``--remote``, by sending that request to a server.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tokenkeys._gen.openengine.v1 import cache_keys_pb2 as pb
from tokenkeys.cli.access_options import add_client_access_options, channel_security
from tokenkeys.cli.common import add_key_spec_options, key_spec_options
from tokenkeys.client import CacheKeyClient
from tokenkeys.errors import InvalidArgument
from tokenkeys.keys import Adapter, KeyContext, MMItem, list_profiles
from tokenkeys.keys.deployment import build_spec
from tokenkeys.keys.proto import request_to_message
from tokenkeys.keys.service import CacheKeyService
from tokenkeys.keys.vectors import write_vectors
from tokenkeys.limits import Limits


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "keys",
        help="list cache-key profiles, or compute the block keys of token ids",
        description="Block keys of token ids under a cache-key profile, computed in process or "
        "by a server (--remote); --list shows the profiles.",
    )
    p.add_argument("--list", action="store_true", help="list the known profiles")
    add_key_spec_options(p, profile_flag="--profile", default_profile=None)
    p.add_argument("--group", type=int, metavar="I", help="keys of KV-cache group I")
    p.add_argument("--model-name", metavar="NAME", help="the request's model (llm-d profiles)")
    p.add_argument("--lora-name", metavar="NAME", help="LoRA adapter name")
    p.add_argument("--lora-path", metavar="PATH", help="LoRA adapter path, as registered")
    p.add_argument("--cache-salt", metavar="S", help="the request's cache salt")
    p.add_argument(
        "--mm",
        action="append",
        default=[],
        metavar="IDENTIFIER:OFFSET:LENGTH",
        help="a multimodal item (repeatable, in offset order)",
    )
    p.add_argument(
        "--prompt-embeds-digest",
        action="append",
        default=[],
        metavar="HEX",
        help="SHA-256 of a block's prompt embeddings (repeat once per block)",
    )
    p.add_argument("--parent", metavar="HEX", help="continue the chain from this block digest")
    tokens = p.add_mutually_exclusive_group()
    tokens.add_argument("--tokens", metavar="1,2,3", help="token ids, comma-separated")
    tokens.add_argument(
        "--tokens-file",
        type=Path,
        metavar="F",
        help="token ids as a JSON list or separated by commas/whitespace ('-': stdin)",
    )
    p.add_argument("--remote", metavar="HOST:PORT", help="ask this server's ComputeCacheKeys")
    p.add_argument("--name", default="", help="served model name (with --remote)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_client_access_options(p)
    p.set_defaults(func=run_keys)

    v = sub.add_parser("vectors", help="write the test vectors of every profile")
    v.add_argument(
        "--out",
        type=Path,
        default=Path("testvectors"),
        help="folder to write (default: ./testvectors)",
    )
    v.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when the files in --out differ from a regeneration",
    )
    v.set_defaults(func=run_vectors)


def run_keys(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    request = pb.ComputeCacheKeysRequest(model=args.name)
    request.requests.append(request_to_message(_tokens(args), _context(args)))
    options = key_spec_options(args)
    given = [
        flag
        for flag, value in (
            ("--block-size", options.block_size),
            ("--root-seed", options.root_seed),
            ("--root-hex", options.root_hex),
            ("--kv-groups", options.kv_groups),
        )
        if value is not None
    ]
    if options.profile is None and given:
        raise InvalidArgument(
            f"{', '.join(given)} describe a spec and need --profile ID; with --remote alone the "
            "server's spec is used as it is",
            field="profile",
        )
    if args.remote:
        with CacheKeyClient(args.remote, args.name, security=channel_security(args)) as client:
            if options.profile is not None:
                # The spec these options describe must be the one the server computes with.
                spec = build_spec(options)
                if spec is not None:
                    request.expected_spec_fingerprint = spec.fingerprint
            response = client.compute_message(request)
    else:
        if options.profile is None:
            raise InvalidArgument(
                "give --profile ID (see tokenkeys keys --list), or --remote HOST:PORT",
                field="profile",
            )
        spec = build_spec(options)
        if spec is None:
            raise InvalidArgument("--profile none computes no keys", field="profile")
        # One request, computed here: no server limits apply.
        limits = Limits(max_texts_per_request=1, max_tokens_per_request=2**62)
        response = CacheKeyService(spec, limits).compute_now(request)
    result = response.results[0]
    keys = [k.hex() for k in result.keys]
    events = list(result.signed_event_keys or result.event_keys)
    if args.json:
        print(json.dumps({"keys": keys, "event_keys": events}))
    else:
        for key, event in zip(keys, events, strict=True):
            print(f"{key} {event}")
    return 0


def _list(args: argparse.Namespace) -> int:
    infos = list_profiles()
    if args.json:
        print(json.dumps([i.to_dict() for i in infos], indent=1))
        return 0
    width = max(len(i.id) for i in infos)
    for info in infos:
        computable = "client" if info.client_computable else "engine-only"
        print(f"{info.id:<{width}}  {computable:<11}  {info.description}")
    return 0


def _tokens(args: argparse.Namespace) -> list[int]:
    if args.tokens is not None:
        text, where = args.tokens, "--tokens"
    elif args.tokens_file is not None:
        where = f"--tokens-file {args.tokens_file}"
        try:
            if str(args.tokens_file) == "-":
                text = sys.stdin.read()
            else:
                text = args.tokens_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidArgument(f"{where}: {exc.strerror or exc}", field="tokens") from None
    else:
        raise InvalidArgument("give --tokens 1,2,3 or --tokens-file FILE", field="tokens")
    try:
        if text.lstrip()[:1] in ("[", "{"):
            values = _ids_of_json(json.loads(text), where)
        else:
            values = [int(t) for t in text.replace(",", " ").split()]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ValueError("not integers")
    except ValueError:
        raise InvalidArgument(
            f"{where}: expected token ids: a JSON list of integers, the output of "
            "`tokenkeys tokenize --json` or of POST /tokenize, or integers separated by "
            "commas or whitespace",
            field="tokens",
        ) from None
    return values


def _ids_of_json(doc: Any, where: str) -> list[Any]:
    """The ids of a JSON document: ``[1, 2]``, ``tokenize --json``'s ``[{"ids": [...]}]`` or
    /tokenize's ``{"tokens": [...]}``."""
    if isinstance(doc, list) and doc and all(isinstance(d, dict) for d in doc):
        if len(doc) != 1:
            raise InvalidArgument(
                f"{where}: holds {len(doc)} tokenized prompts; keys takes one (tokenize one "
                "text, or pick one entry)",
                field="tokens",
            )
        doc = doc[0]
    if isinstance(doc, dict):
        doc = doc.get("ids", doc.get("tokens"))
    if not isinstance(doc, list):
        raise ValueError("not a list")
    return doc


def _context(args: argparse.Namespace) -> KeyContext | None:
    if args.lora_path is not None and args.lora_name is None:
        raise InvalidArgument("--lora-path needs --lora-name", field="lora_path")
    items = []
    for text in args.mm:
        identifier, _, rest = text.rpartition(":")
        identifier, _, offset = identifier.rpartition(":")
        if not identifier or not offset.isdigit() or not rest.isdigit():
            raise InvalidArgument(
                f"--mm {text!r}: expected IDENTIFIER:OFFSET:LENGTH with non-negative integers",
                field="mm",
            )
        items.append(MMItem(identifier, int(offset), int(rest)))
    embeds = tuple(_hex(h, "--prompt-embeds-digest") for h in args.prompt_embeds_digest)
    fields = {
        "model": args.model_name,
        "adapter": Adapter(args.lora_name, args.lora_path) if args.lora_name is not None else None,
        "cache_salt": args.cache_salt,
        "group": args.group,
        "parent": _hex(args.parent, "--parent") if args.parent is not None else None,
    }
    if all(v is None for v in fields.values()) and not items and not embeds:
        return None
    return KeyContext(**fields, mm_items=tuple(items), prompt_embeds_digests=embeds)


def _hex(text: str, option: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise InvalidArgument(f"{option} {text!r} is not hex", field=option) from None


def run_vectors(args: argparse.Namespace) -> int:
    if not args.check:
        for path in write_vectors(args.out):
            print(path)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p.read_text(encoding="utf-8") for p in write_vectors(tmp)}
    existing = {p.name for p in args.out.glob("*.json")}
    stale = sorted(
        name
        for name in fresh.keys() | existing
        if name not in existing
        or name not in fresh
        or (args.out / name).read_text(encoding="utf-8") != fresh[name]
    )
    for name in stale:
        print(f"stale: {args.out / name}", file=sys.stderr)
    if stale:
        print("regenerate with: tokenkeys vectors --out " + str(args.out), file=sys.stderr)
        return 1
    print(f"{len(fresh)} vector files in {args.out} are current")
    return 0
