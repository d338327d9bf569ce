"""The ``tokenkeys`` command: one module per group of subcommands, registered here."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from tokenkeys.cli import interrupts

# Each module exposes register(subparsers); a subcommand's parser sets ``func(args) -> int``.
# Imported by build_parser, not here: they take seconds to import (FastAPI, gRPC, tokenizers),
# and main() latches Ctrl-C first (tokenkeys.cli.interrupts) so one pressed meanwhile counts.
#: The module registering each command (tests/cli/test_cli_commands.py holds it to the modules).
COMMANDS = {
    "serve": "serve",
    "route": "route",
    "info": "tokens",
    "tokenize": "tokens",
    "detokenize": "tokens",
    "pull": "pull",
    "prune": "pull",
    "keys": "keys",
    "vectors": "keys",
    "parity": "parity",
}
#: Exit status when the reader of stdout went away (``tokenkeys keys --list | head``): what a
#: shell reports for a program ended by SIGPIPE, 128 + 13.
EXIT_BROKEN_PIPE = 141


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser (also used to document the CLI): every command's, or only that of
    ``command`` when it names one (a command imports only its own module: a second or two of
    CPU less for ``tokenkeys keys``; what it parses and its messages are the same)."""
    parser = argparse.ArgumentParser(
        prog="tokenkeys",
        description="Tokenizer and KV prefix-cache key interoperability for LLM serving.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [COMMANDS[command]] if command in COMMANDS else COMMANDS.values()
    for name in dict.fromkeys(modules):
        importlib.import_module(f"tokenkeys.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; errors print one clear line and exit 2."""
    interrupts.latch()
    try:
        return _run(argv)
    except KeyboardInterrupt:  # one latched (or a second one) before the command started
        return 130
    finally:
        interrupts.unlatch()


def _run(argv: Sequence[str] | None) -> int:
    import logging

    from tokenkeys.process.logs import configured, quiet_grpc_core

    quiet_grpc_core()  # before gRPC is imported (it reads the setting once)
    from tokenkeys.errors import TokenkeysError
    from tokenkeys.process.allocator import restart_tuned
    from tokenkeys.terminal import printable

    command = _command(sys.argv[1:] if argv is None else argv)
    if argv is None and command == "serve":
        # The serving process's allocator (tokenkeys.process.allocator), before the parser
        # imports the commands' modules: the process that re-executes has imported nothing to
        # throw away (about half of a serve start's CPU seconds otherwise).
        restart_tuned()
    parser = build_parser(command)
    args = parser.parse_args(argv)
    interrupts.release()  # a Ctrl-C during the imports and parsing ends the command here
    try:
        return int(args.func(args) or 0)
    except TokenkeysError as error:
        line = f"tokenkeys {args.command}: error: {printable(error.message)}"
        if configured():  # a serving command's log: the error in its format
            logging.getLogger(f"tokenkeys.{args.command}").error("%s", line)
        else:
            print(line, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader closed the pipe: stop quietly. stdout now points at /dev/null so that the
        # interpreter's final flush does not raise (and print) the same error again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _command(args: Sequence[str]) -> str | None:
    """The subcommand ``args`` name first, if they do (an option first, such as ``-h``, asks
    the whole parser)."""
    return args[0] if args and not args[0].startswith("-") else None


if __name__ == "__main__":
    sys.exit(main())
