"""``tokenkeys parity``: certify, shape by shape, that tokenkeys renders the ids a live engine does.

Exit status: 0 when every shape is certified, 1 when one differs, errs or cannot be verified,
2 on a usage error (tokenkeys.cli.main's status for every TokenkeysError raised here).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenkeys.cli.help import DefaultsFormatter, essentials_first
from tokenkeys.cli.serve_http import load_chat_template
from tokenkeys.limits import Limits
from tokenkeys.parity import corpus
from tokenkeys.parity.compare import Result, check
from tokenkeys.parity.engine import LiveEngine
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.preprocess.preprocessor import Preprocessor
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.terminal import printable
from tokenkeys.tokenizer import TokenizerOptions
from tokenkeys.tokenizer.options import BACKENDS

#: Seconds each engine call may take, by default.
DEFAULT_TIMEOUT = 30.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "parity",
        help="certify per request shape that tokenkeys renders the ids a live engine renders",
        description="Send each request shape to a live engine's render routes (else /tokenize) "
        "and to tokenkeys' own Preprocessor; print per shape 'certified' or the first "
        "differing token with its context and a likely cause. Exit 0 only when every shape "
        "is certified, 1 otherwise, 2 on a usage error.",
        formatter_class=DefaultsFormatter,
    )
    p.add_argument(
        "--engine", required=True, metavar="URL", help="the engine's HTTP API, http://HOST:PORT"
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help="the model name sent to the engine (default: the first /v1/models lists)",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        metavar="DIR",
        help="tokenizer folder tokenkeys renders with (default: the embedded "
        "smollm2-135m-instruct)",
    )
    p.add_argument(
        "--corpus",
        type=Path,
        metavar="FILE",
        help='JSONL of {"name", "route", "body"} shapes, route one of '
        f"{', '.join(corpus.ROUTES)} (default: the built-in corpus)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable results")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="tokenizers",
        help="tokenizer library tokenkeys reproduces (vLLM 0.32: transformers5)",
    )
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="the chat template tokenkeys renders with, as the engine's --chat-template "
        "(default: the tokenizer folder's)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long each engine call may take",
    )
    essentials_first(p, "--engine", "--model", "--tokenizer", "--corpus", "--json")
    p.set_defaults(func=run_parity)


def _preprocessor(args: argparse.Namespace) -> Preprocessor:
    """The Preprocessor of ``--tokenizer`` (or the embedded one), backend and template given."""
    source = (
        ModelSource.default() if args.tokenizer is None else ModelSource.parse(str(args.tokenizer))
    )
    chat = None
    if args.chat_template:
        path = Path(args.chat_template)
        # Read here, never published: the folder it is in is the one allowed.
        chat = ChatOptions(
            chat_template=load_chat_template(args.chat_template, [path.resolve().parent])
        )
    return (
        load_models([source], TokenizerOptions(backend=args.backend), Limits(), chat)
        .get(None)
        .preprocessor
    )


def _line(result: Result) -> str:
    head = f"{result.status:<11} {result.name} ({result.route}, {result.source or 'no source'})"
    d = result.detail
    if result.status == "certified":
        return f"{head}: {result.tokens} tokens"
    if "index" not in d:
        return f"{head}: " + "; ".join(str(d[k]) for k in ("error", "likely_cause") if k in d)
    prompt = f"prompt {d['prompt']}, " if d["prompt"] else ""
    lines = [
        f"{head}: {prompt}first differing token at {d['index']} "
        f"(engine {d['engine_tokens']} tokens, tokenkeys {d['tokenkeys_tokens']})",
        f"    engine     {_window(d['engine'], d['index'])}",
        f"    tokenkeys  {_window(d['tokenkeys'], d['index'])}",
        f"    {d['likely_cause']}",
    ]
    return "\n".join(lines)


def _window(context: dict, index: int) -> str:
    """The context tokens, the first differing one in brackets (escaped for the terminal)."""
    parts = []
    for at, (token_id, text) in enumerate(
        zip(context["ids"], context["text"], strict=True), context["from"]
    ):
        shown = f"{printable(repr(text))}:{token_id}"
        parts.append(f"[{shown}]" if at == index else shown)
    return " ".join(parts) or "(nothing: the sequence ends here)"


def run_parity(args: argparse.Namespace) -> int:
    shapes = corpus.load(args.corpus) if args.corpus is not None else list(corpus.BUILT_IN)
    engine = LiveEngine(args.engine, args.timeout)
    try:
        pre = _preprocessor(args)
        model = args.model or engine.first_model()
        results = [check(pre, engine, shape, model) for shape in shapes]
    finally:
        engine.close()
    certified = sum(r.status == "certified" for r in results)
    if args.json:
        summary = {"engine": engine.base, "model": model, "certified": certified}
        print(json.dumps({**summary, "shapes": [r.as_json() for r in results]}, indent=2))
    else:
        for result in results:
            print(_line(result))
        print(f"{certified} of {len(results)} shapes certified against {engine.base} ({model})")
    return 0 if certified == len(results) else 1
