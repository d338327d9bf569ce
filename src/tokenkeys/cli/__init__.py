"""The ``tokenkeys`` command: one module per group of subcommands, registered here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tokenkeys.cli import keys, pull, route, serve, tokens
from tokenkeys.errors import TokenkeysError
from tokenkeys.terminal import printable

# Each module exposes register(subparsers); a subcommand's parser sets ``func(args) -> int``.
_MODULES = (serve, route, tokens, pull, keys)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (also used to document the CLI)."""
    parser = argparse.ArgumentParser(
        prog="tokenkeys",
        description="Tokenizer and KV prefix-cache key interoperability for LLM serving.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; errors print one clear line and exit 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TokenkeysError as error:
        print(f"tokenkeys {args.command}: error: {printable(error.message)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
