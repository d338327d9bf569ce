"""Bearer tokens: read from a file or an environment variable, compared in constant time.

A token file holds one token per non-empty line (several lines let an operator rotate tokens
without a restart window: add the new one, move clients, remove the old one). Tokens never
appear in messages, logs or ``repr``; errors name the file or variable they came from.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from tokenkeys.errors import ConfigError, Unauthenticated

_SCHEME = "bearer "
# Token characters: RFC 6750 b64token, so a token fits an HTTP header and gRPC metadata as is.
_ALLOWED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")
_MIN_LENGTH = 16


def _check_token(token: str, where: str) -> str:
    if len(token) < _MIN_LENGTH:
        raise ConfigError(
            f"the token in {where} has {len(token)} characters; use at least {_MIN_LENGTH} "
            "random characters (e.g. `openssl rand -hex 32`)",
            field="auth_token",
        )
    if not set(token) <= _ALLOWED:
        raise ConfigError(
            f"the token in {where} has characters outside A-Z a-z 0-9 - . _ ~ + / =; use a "
            "random hex or base64 string",
            field="auth_token",
        )
    return token


def _read_file(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc}", field="auth_token") from exc
    return [line.strip() for line in text.splitlines() if line.strip()]


def load_token(
    file: str | os.PathLike[str] | None = None,
    env: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> str | None:
    """A client's token: the first line of ``file``, else the variable ``env``; None if neither."""
    if file is not None:
        lines = _read_file(Path(file))
        if not lines:
            raise ConfigError(f"the token file {file} is empty", field="auth_token")
        return _check_token(lines[0], str(file))
    if env is not None:
        value = environ.get(env, "").strip()
        if not value:
            raise ConfigError(
                f"the environment variable {env} holds no token; set it or drop the option",
                field="auth_token",
            )
        return _check_token(value, f"${env}")
    return None


class BearerTokens:
    """The tokens a server accepts in ``Authorization: Bearer <token>``."""

    def __init__(self, tokens: list[str], source: str) -> None:
        if not tokens:
            raise ConfigError(f"{source} holds no token", field="auth_token")
        self._tokens = tuple(_check_token(t, source).encode() for t in tokens)
        #: Where the tokens came from (a file or a variable name), for the server log.
        self.source = source

    @classmethod
    def load(
        cls,
        file: str | os.PathLike[str] | None = None,
        env: str | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> BearerTokens | None:
        """Tokens from ``file`` (one per line) or the variable ``env``; None if neither is given."""
        if file is not None:
            return cls(_read_file(Path(file)), f"token file {file}")
        if env is not None:
            value = environ.get(env, "").strip()
            return cls([value] if value else [], f"${env}")
        return None

    def __repr__(self) -> str:
        return f"BearerTokens({len(self._tokens)} from {self.source})"

    def check(self, authorization: str | None) -> None:
        """Accept ``Bearer <token>`` with a known token; raise Unauthenticated otherwise."""
        if not authorization:
            raise Unauthenticated(
                "this server requires a bearer token: send the header (gRPC metadata) "
                "'authorization: Bearer <token>'",
                field="authorization",
            )
        if authorization[: len(_SCHEME)].lower() != _SCHEME:
            raise Unauthenticated(
                "the authorization value is not of the form 'Bearer <token>'",
                field="authorization",
            )
        given = authorization[len(_SCHEME) :].strip().encode("utf-8", "replace")
        # Compare with every token, always: the time taken says nothing about which matched.
        matched = False
        for token in self._tokens:
            matched |= hmac.compare_digest(given, token)
        if not matched:
            raise Unauthenticated(
                "the bearer token is not valid for this server", field="authorization"
            )
