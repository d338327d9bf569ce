"""``tokenkeys info | tokenize | detokenize``, in process or against a server (``--remote``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from google.protobuf.json_format import MessageToDict

from tokenkeys.cli.access_options import add_client_access_options, channel_security
from tokenkeys.cli.common import add_tokenizer_options, local_models
from tokenkeys.client import TokenizerClient
from tokenkeys.errors import InvalidArgument
from tokenkeys.server.grpc.tokenizer_info import tokenizer_info
from tokenkeys.terminal import printable


def register(sub: argparse._SubParsersAction) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        add_tokenizer_options(p, many=False)
        p.add_argument("--remote", metavar="HOST:PORT", help="ask a tokenkeys server instead")
        p.add_argument("--name", default="", help="served model name (with --remote)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        add_client_access_options(p)

    p = sub.add_parser("info", help="show a tokenizer's identity and special tokens")
    common(p)
    p.set_defaults(func=run_info)

    p = sub.add_parser("tokenize", help="encode texts to ids")
    common(p)
    p.add_argument("texts", nargs="*", metavar="TEXT")
    p.add_argument("--input", type=Path, help="JSON file holding a list of texts")
    special = p.add_mutually_exclusive_group()
    special.add_argument("--add-special-tokens", dest="special", action="store_true", default=None)
    special.add_argument("--no-special-tokens", dest="special", action="store_false")
    p.set_defaults(func=run_tokenize)

    p = sub.add_parser("detokenize", help="decode ids to text")
    common(p)
    p.add_argument("ids", nargs="+", type=int, metavar="ID")
    p.add_argument("--skip-special-tokens", action="store_true", default=None)
    p.set_defaults(func=run_detokenize)


def _texts(args: argparse.Namespace) -> list[str]:
    texts = list(args.texts)
    if args.input is not None:
        try:
            loaded = json.loads(args.input.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidArgument(f"--input {args.input}: {exc}", field="input") from exc
        if not isinstance(loaded, list) or not all(isinstance(t, str) for t in loaded):
            raise InvalidArgument(
                f"--input {args.input}: expected a JSON list of strings", field="input"
            )
        texts += loaded
    if not texts:
        raise InvalidArgument("give at least one TEXT or --input FILE", field="texts")
    return texts


def run_info(args: argparse.Namespace) -> int:
    if args.remote:
        with TokenizerClient(args.remote, security=channel_security(args)) as client:
            info = client.info(args.name)
    else:
        models = local_models(args)
        info = tokenizer_info(models.get(None), models.names)
    if args.json:
        print(json.dumps(MessageToDict(info, preserving_proto_field_name=True), indent=2))
    else:
        sp = info.special_tokens
        # Every value came from the server: escaped for the terminal.
        print(f"model        {printable(info.model)}")
        print(f"fingerprint  {printable(info.fingerprint)}")
        print(f"backend      {printable(info.backend)} {printable(info.backend_version)}")
        print(f"vocab_size   {info.vocab_size}")
        print(f"max_context  {info.max_context_length or 'unknown'}")
        print(f"bos          {sp.bos.content!r} ({sp.bos.id})" if sp.HasField("bos") else "bos -")
        print("eos          " + ", ".join(f"{e.content!r} ({e.id})" for e in sp.eos))
    return 0


def run_tokenize(args: argparse.Namespace) -> int:
    texts = _texts(args)
    if args.remote:
        with TokenizerClient(args.remote, security=channel_security(args)) as client:
            response = client.tokenize(texts, model=args.name, add_special_tokens=args.special)
        results = [list(r.ids) for r in response.results]
    else:
        pre = local_models(args).get(None).preprocessor
        results = [r.ids for r in pre.tokenize_prompts(texts, add_special_tokens=args.special)]
    if args.json:
        print(json.dumps([{"ids": ids, "count": len(ids)} for ids in results]))
    else:
        for ids in results:
            print(" ".join(map(str, ids)))
    return 0


def run_detokenize(args: argparse.Namespace) -> int:
    if args.remote:
        with TokenizerClient(args.remote, security=channel_security(args)) as client:
            text = client.detokenize(
                [args.ids], model=args.name, skip_special_tokens=args.skip_special_tokens
            ).texts[0]
    else:
        pre = local_models(args).get(None).preprocessor
        text = pre.detokenize([args.ids], skip_special_tokens=args.skip_special_tokens)[0]
    if args.json:
        print(json.dumps({"text": text}))
    else:
        # The decoded text is the data asked for: exact in a pipe, escaped on a terminal, where
        # a remote server's control or bidi characters would act on the screen.
        sys.stdout.write((printable(text) if sys.stdout.isatty() else text) + "\n")
    return 0
