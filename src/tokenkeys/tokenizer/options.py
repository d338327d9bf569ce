"""Serving options that change what a tokenizer produces, and are therefore part of its identity."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from tokenkeys.errors import ConfigError

Backend = Literal["tokenizers", "transformers5", "transformers"]
NulHandling = Literal["keep", "strip"]

BACKENDS: tuple[str, ...] = ("tokenizers", "transformers5", "transformers")


@dataclass(frozen=True)
class TokenizerOptions:
    """Behaviour defaults of one served tokenizer; every field enters the fingerprint.

    - ``backend``: ``tokenizers`` (the Rust library on tokenizer.json, what Rust frontends serve),
      ``transformers5`` (the folder as transformers 5 builds it: what vLLM 0.32 serves, without
      needing transformers) or ``transformers`` (the installed transformers' classes, as vLLM
      and SGLang load them).
    - ``add_special_tokens_completion`` / ``add_special_tokens_chat``: what an unset
      ``add_special_tokens`` means for a bare prompt and for a rendered chat. The defaults are
      vLLM's (True for /v1/completions, False for chat, whose template already holds the specials).
    - ``nul``: ``keep`` NUL characters in text (vLLM) or ``strip`` them (Dynamo's frontend).
    - ``split_special_tokens``: when True, special-token text inside user text is encoded as plain
      text instead of the special id (transformers' ``split_special_tokens``).
    - ``chat_template_sha256``: digest of a server-side ``--chat-template`` override, if any.
    """

    backend: Backend = "tokenizers"
    add_special_tokens_completion: bool = True
    add_special_tokens_chat: bool = False
    nul: NulHandling = "keep"
    split_special_tokens: bool = False
    chat_template_sha256: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"backend {self.backend!r} is not supported; choose one of {', '.join(BACKENDS)}",
                field="backend",
            )
        if self.nul not in ("keep", "strip"):
            raise ConfigError(f"nul handling {self.nul!r} is not 'keep' or 'strip'", field="nul")

    def identity(self) -> dict[str, Any]:
        """The canonical, JSON-serializable form that enters the fingerprint."""
        return asdict(self)
