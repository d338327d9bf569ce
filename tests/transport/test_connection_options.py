"""Connection limits as options: validated, on serve and route, and each in the operator docs."""

from __future__ import annotations

from dataclasses import fields

import pytest

from tokenkeys.cli import build_parser
from tokenkeys.cli.connection_options import connection_limits_from
from tokenkeys.errors import ConfigError
from tokenkeys.transport.limits import ConnectionLimits

from support import REPO

OPTIONS = ["--" + f.name.replace("_", "-") for f in fields(ConnectionLimits)]


def test_serve_takes_every_connection_option() -> None:
    args = build_parser().parse_args(
        ["serve", "--http-max-header-bytes", "1000", "--grpc-max-connection-idle", "2.5"]
    )
    limits = connection_limits_from(args)
    assert limits.http_max_header_bytes == 1000
    assert limits.grpc_max_connection_idle == 2.5
    assert limits.http_header_timeout == ConnectionLimits.http_header_timeout


def test_route_takes_the_http_ones_only() -> None:
    args = build_parser().parse_args(
        ["route", "--worker", "x:1", "--http-max-connections-per-client", "0"]
    )
    assert connection_limits_from(args).http_max_connections_per_client == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["route", "--worker", "x:1", "--grpc-max-connections", "5"])


@pytest.mark.parametrize(
    "bad",
    [
        {"http_max_header_bytes": 0},
        {"http_header_timeout": -1.0},
        {"http_max_connections": 1.5},
        {"grpc_max_connection_age": -1.0},
        {"http_max_connections_per_client": True},
    ],
)
def test_bad_values_name_the_option(bad: dict) -> None:
    with pytest.raises(ConfigError) as info:
        ConnectionLimits(**bad)
    (name,) = bad
    assert info.value.field == name
    assert "--" + name.replace("_", "-") in info.value.message


def test_zero_turns_off_only_what_says_so() -> None:
    limits = ConnectionLimits(http_max_connections_per_client=0, grpc_max_connection_age=0)
    assert limits.http_max_connections_per_client == 0


def test_every_option_is_in_the_denial_of_service_table() -> None:
    text = (REPO / "docs" / "operating.md").read_text()
    section = text.split("## Denial of service", 1)[1].split("\n## ", 1)[0]
    for option in OPTIONS:
        assert f"| `{option}` |" in section, option
