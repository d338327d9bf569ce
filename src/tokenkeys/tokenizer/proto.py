"""Conversions between the tokenizer core and the OpenEngineTokenizer protobuf messages."""

from __future__ import annotations

import re

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.errors import ConfigError, InvalidArgument
from tokenkeys.tokenizer import Tokenizer, TokenizerOptions, Truncation

_NUL = {pb.NUL_HANDLING_KEEP: "keep", pb.NUL_HANDLING_STRIP: "strip"}
_NUL_TO_PROTO = {v: k for k, v in _NUL.items()}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def nul_from_proto(value: int) -> str | None:
    """NulHandling enum to the core's name; UNSPECIFIED means the server default (None)."""
    if value == pb.NUL_HANDLING_UNSPECIFIED:
        return None
    try:
        return _NUL[value]
    except KeyError:
        raise InvalidArgument(
            f"nul_handling {value} is not a known NulHandling value "
            f"(allowed: {', '.join(pb.NulHandling.keys())})",
            field="nul_handling",
        ) from None


def truncation_from_proto(message: pb.Truncation) -> Truncation:
    """Truncation message to the core's value; validates the side enum."""
    sides = {
        pb.TRUNCATION_SIDE_UNSPECIFIED: "right",
        pb.TRUNCATION_SIDE_RIGHT: "right",
        pb.TRUNCATION_SIDE_LEFT: "left",
    }
    if message.side not in sides:
        raise InvalidArgument(
            f"truncation.side {message.side} is not a known TruncationSide value "
            f"(allowed: {', '.join(pb.TruncationSide.keys())})",
            field="truncation.side",
        )
    return Truncation(message.max_tokens, sides[message.side])


def option_defaults(tokenizer: Tokenizer) -> pb.OptionDefaults:
    """What each unset request option means for this tokenizer."""
    opts = tokenizer.options
    return pb.OptionDefaults(
        add_special_tokens=opts.add_special_tokens_completion,
        add_special_tokens_chat=opts.add_special_tokens_chat,
        skip_special_tokens=False,
        nul_handling=_NUL_TO_PROTO[opts.nul],
        truncation_side=pb.TRUNCATION_SIDE_RIGHT,
        split_special_tokens=opts.split_special_tokens,
    )


def tokenizer_identity(tokenizer: Tokenizer) -> pb.TokenizerIdentity:
    """Everything besides the files that enters the fingerprint."""
    return pb.TokenizerIdentity(
        backend=tokenizer.options.backend,
        behaviour=tokenizer.backend.behaviour,
        defaults=option_defaults(tokenizer),
        chat_template_override_sha256=tokenizer.options.chat_template_sha256 or "",
    )


def identity_options(identity: pb.TokenizerIdentity) -> tuple[TokenizerOptions, str]:
    """The behaviour options and behaviour string a ``TokenizerIdentity`` describes.

    The inverse of :func:`tokenizer_identity`; a property test keeps the two in step.
    """
    defaults = identity.defaults
    nul = _NUL.get(defaults.nul_handling)
    if nul is None:
        raise InvalidArgument(
            f"identity.defaults.nul_handling {defaults.nul_handling} is not KEEP or STRIP",
            field="identity.defaults.nul_handling",
        )
    override = identity.chat_template_override_sha256
    if override and not _HEX64.match(override):
        raise InvalidArgument(
            f"identity.chat_template_override_sha256 {override!r} is not 64 lowercase hex",
            field="identity.chat_template_override_sha256",
        )
    if not identity.behaviour:
        raise InvalidArgument("identity.behaviour is empty", field="identity.behaviour")
    try:
        options = TokenizerOptions(
            backend=identity.backend,  # type: ignore[arg-type]
            add_special_tokens_completion=defaults.add_special_tokens,
            add_special_tokens_chat=defaults.add_special_tokens_chat,
            nul=nul,  # type: ignore[arg-type]
            split_special_tokens=defaults.split_special_tokens,
            chat_template_sha256=override or None,
        )
    except ConfigError as exc:
        raise InvalidArgument(
            f"identity is not usable here: {exc.message}", field="identity"
        ) from exc
    return options, identity.behaviour
