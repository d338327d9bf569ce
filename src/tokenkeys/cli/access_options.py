"""TLS and bearer-token options: the server side (``serve``) and the client side (``--remote``,
``pull``).

The token itself is never an option value (it would show in ``ps`` and shell history): it is
read from a file (``--auth-token-file``) or an environment variable (``--auth-token-env``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenkeys.access import BearerTokens, ChannelSecurity, ClientTls, ServerTls, load_token
from tokenkeys.errors import ConfigError


def add_server_access_options(parser: argparse.ArgumentParser, *, templates: bool = True) -> None:
    """TLS, bearer tokens, and (``templates``) where --chat-template files may come from."""
    g = parser.add_argument_group("access control")
    g.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve TLS with this certificate")
    g.add_argument("--tls-key", type=Path, metavar="PEM", help="private key of --tls-cert")
    g.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="PEM",
        help="require client certificates signed by this CA (mutual TLS)",
    )
    g.add_argument(
        "--auth-token-file",
        type=Path,
        metavar="FILE",
        help="require 'Authorization: Bearer <token>' (HTTP) / 'authorization' metadata (gRPC) "
        "with a token from this file, one per line",
    )
    g.add_argument(
        "--auth-token-env",
        metavar="VAR",
        help="as --auth-token-file, the token read from the environment variable VAR",
    )
    g.add_argument(
        "--auth-health",
        action="store_true",
        help="require the token on /health and Control.Health too (default: exempt, for probes)",
    )
    if not templates:
        return
    g.add_argument(
        "--allowed-template-dir",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="folder --chat-template files may be read from (repeatable; default: the current "
        "directory and the served tokenizer folders)",
    )


def server_tls(args: argparse.Namespace) -> ServerTls | None:
    """The server's TLS files, or None without --tls-cert."""
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise _config("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise _config("TLS needs both --tls-cert and --tls-key")
    return ServerTls(args.tls_cert, args.tls_key, args.tls_client_ca)


def server_tokens(args: argparse.Namespace) -> BearerTokens | None:
    """The accepted bearer tokens, or None without a token option."""
    if args.auth_token_file is not None and args.auth_token_env is not None:
        raise _config("give --auth-token-file or --auth-token-env, not both")
    if args.auth_health and args.auth_token_file is None and args.auth_token_env is None:
        raise _config("--auth-health needs --auth-token-file or --auth-token-env")
    return BearerTokens.load(args.auth_token_file, args.auth_token_env)


def add_client_access_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """TLS and token options of a command that calls a server (``prefix``: e.g. ``worker-``)."""
    g = parser.add_argument_group("connecting to " + ("the workers" if prefix else "a server"))
    p = f"--{prefix}"
    g.add_argument(f"{p}tls", action="store_true", help="connect with TLS (system roots)")
    g.add_argument(
        f"{p}tls-ca", type=Path, metavar="PEM", help="connect with TLS, trusting this CA"
    )
    g.add_argument(f"{p}tls-cert", type=Path, metavar="PEM", help="client certificate (mutual TLS)")
    g.add_argument(f"{p}tls-key", type=Path, metavar="PEM", help="private key of the certificate")
    g.add_argument(
        f"{p}tls-server-name", metavar="NAME", help="expect this name in the server certificate"
    )
    g.add_argument(f"{p}auth-token-file", type=Path, metavar="FILE", help="bearer token file")
    g.add_argument(f"{p}auth-token-env", metavar="VAR", help="bearer token environment variable")


def channel_security(args: argparse.Namespace, prefix: str = "") -> ChannelSecurity:
    """How a client command reaches its server(s), from the options of ``prefix``."""
    d = prefix.replace("-", "_")

    def opt(name: str):  # noqa: ANN202
        return getattr(args, d + name)

    uses_tls = (
        opt("tls")
        or opt("tls_ca") is not None
        or opt("tls_cert") is not None
        or opt("tls_server_name") is not None
    )
    tls = (
        ClientTls(opt("tls_ca"), opt("tls_cert"), opt("tls_key"), opt("tls_server_name"))
        if uses_tls
        else None
    )
    if opt("auth_token_file") is not None and opt("auth_token_env") is not None:
        raise _config(f"give --{prefix}auth-token-file or --{prefix}auth-token-env, not both")
    return ChannelSecurity(tls, load_token(opt("auth_token_file"), opt("auth_token_env")))


def _config(message: str) -> ConfigError:
    return ConfigError(message, field="access")
