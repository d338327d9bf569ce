"""The CLI's table of commands (``tokenkeys.cli.COMMANDS``) is what the modules register: a
command's own parser, built from its module alone, parses as the whole parser does."""

from __future__ import annotations

import pytest

from tokenkeys.cli import COMMANDS, build_parser


def _choices(command: str | None = None) -> set[str]:
    parser = build_parser(command)
    (sub,) = [a for a in parser._actions if a.dest == "command"]  # argparse's subparsers
    return set(sub.choices)


def test_the_whole_parser_has_every_command_in_the_table() -> None:
    assert _choices() == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_commands_own_parser_has_it(command: str) -> None:
    assert command in _choices(command)
    assert _choices(command) <= {c for c, m in COMMANDS.items() if m == COMMANDS[command]}


def test_a_command_parses_the_same_alone_and_in_the_whole_parser() -> None:
    argv = ["keys", "--profile", "vllm/sha256_cbor", "--block-size", "16", "--tokens", "1,2"]
    assert vars(build_parser("keys").parse_args(argv)) == vars(build_parser().parse_args(argv))
