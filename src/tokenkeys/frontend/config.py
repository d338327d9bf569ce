"""Settings of the HTTP frontend, and where the tokenize and detokenize routes are mounted."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokenkeys.access.token import BearerTokens
from tokenkeys.errors import ConfigError
from tokenkeys.limits import Limits
from tokenkeys.tokenizer import TOKEN_STRS, TokenStrs

TOKENIZE_PATH_ENV = "TOKENKEYS_TOKENIZE_PATH"
DETOKENIZE_PATH_ENV = "TOKENKEYS_DETOKENIZE_PATH"

# Routes whose paths are fixed; a configured tokenize path may not shadow one of them.
FIXED_PATHS = frozenset(
    {
        "/v1/models",
        "/v1/completions",
        "/v1/chat/completions",
        "/tokenizer_info",
        "/health",
        "/livez",
        "/metrics",
        "/openapi.json",
    }
)
_PATH = re.compile(r"^(/[A-Za-z0-9._~!$&'()*+,;=:@-]+)+$")


@dataclass(frozen=True)
class HttpConfig:
    """What the app serves where, and how it reads requests.

    - ``tokenize_path`` / ``detokenize_path``: where /tokenize and /detokenize are mounted
      (``--tokenize-path``, ``TOKENKEYS_TOKENIZE_PATH``; see :func:`resolve_paths`).
    - ``limits``: request limits; ``max_request_bytes`` bounds an HTTP body (413 above it).
    - ``inline_bytes``: bodies up to this size are tokenized on the event loop; larger ones on
      a worker thread (``tokenizers`` releases the GIL), so encodes neither stall the other
      requests nor the gRPC calls sharing the loop, and use a second core (bench_load).
    - ``auth``: bearer tokens every request must carry (None: no authentication);
      ``auth_health``: whether /health needs one too (default: exempt, for probes).
    - ``token_strs``: how /tokenize spells ``token_strs`` unless the request's
      ``token_strs_kind`` says: ``"decoded"`` (each token's text, the default) or
      ``"vocabulary"`` (vLLM's ``convert_ids_to_tokens`` spellings).
    - ``access_log``: log one line per request (:mod:`tokenkeys.frontend.access_log`).
    """

    tokenize_path: str = "/tokenize"
    detokenize_path: str = "/detokenize"
    limits: Limits = field(default_factory=Limits)
    inline_bytes: int = 2048
    auth: BearerTokens | None = None
    auth_health: bool = False
    token_strs: TokenStrs = "decoded"
    access_log: bool = False

    def __post_init__(self) -> None:
        if self.token_strs not in TOKEN_STRS:
            raise ConfigError(
                f"token_strs must be one of {', '.join(TOKEN_STRS)}, got {self.token_strs!r}",
                field="token_strs",
            )
        for name in ("tokenize_path", "detokenize_path"):
            path = getattr(self, name)
            if not isinstance(path, str) or not _PATH.match(path):
                raise ConfigError(
                    f"{name} {path!r} is not a plain URL path; give one like /tokenize "
                    "(a leading slash, no spaces, no query, no {parameters})",
                    field=name,
                )
            if path in FIXED_PATHS:
                raise ConfigError(
                    f"{name} {path!r} is already a route of this server; choose another path",
                    field=name,
                )
        if self.tokenize_path == self.detokenize_path:
            raise ConfigError(
                f"tokenize_path and detokenize_path are both {self.tokenize_path!r}; they must "
                "differ",
                field="detokenize_path",
            )


def resolve_paths(
    tokenize_path: str | None,
    detokenize_path: str | None,
    environ: Mapping[str, str],
) -> tuple[str, str]:
    """The tokenize and detokenize paths: the command line wins, then the environment.

    ``None`` means the option was not given; an empty environment variable counts as unset.
    """
    tok = tokenize_path or environ.get(TOKENIZE_PATH_ENV) or "/tokenize"
    detok = detokenize_path or environ.get(DETOKENIZE_PATH_ENV) or "/detokenize"
    return tok, detok
