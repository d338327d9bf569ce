"""Conversions between the tokenizer core and the OpenEngineTokenizer protobuf messages."""

from __future__ import annotations

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.errors import InvalidArgument
from tokenkeys.tokenizer import Tokenizer, Truncation

_NUL = {pb.NUL_HANDLING_KEEP: "keep", pb.NUL_HANDLING_STRIP: "strip"}
_NUL_TO_PROTO = {v: k for k, v in _NUL.items()}


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
