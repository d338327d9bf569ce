"""Conversions between the tokenizer core and the OpenEngineTokenizer protobuf messages."""

from __future__ import annotations

import hashlib

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.errors import InvalidArgument
from tokenkeys.serving.models import ServedModel
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


def supported_operations(model: ServedModel) -> list[int]:
    """The OpenEngineTokenizer operations served for ``model`` (TokenizerOperation values)."""
    operations = [pb.TOKENIZER_OPERATION_TOKENIZE, pb.TOKENIZER_OPERATION_DETOKENIZE]
    if "artifacts" in model.extensions:
        operations.append(pb.TOKENIZER_OPERATION_ARTIFACTS)
    if "cache_keys" in model.extensions:
        operations += [
            pb.TOKENIZER_OPERATION_CACHE_KEY_SPEC,
            pb.TOKENIZER_OPERATION_COMPUTE_CACHE_KEYS,
        ]
    return operations


def tokenizer_info(model: ServedModel, served_names: list[str]) -> pb.TokenizerInfo:
    """Build the TokenizerInfo answer for one served model."""
    tok = model.tokenizer
    sp = tok.specials
    specials = pb.SpecialTokens(
        eos=[pb.SpecialToken(content=e.content, id=e.id) for e in sp.eos],
        added=[pb.AddedToken(id=a.id, content=a.content, special=a.special) for a in sp.added],
    )
    for role in ("bos", "pad", "unk"):
        ref = getattr(sp, role)
        if ref is not None:
            getattr(specials, role).CopyFrom(pb.SpecialToken(content=ref.content, id=ref.id))
    template = model.extensions.get("chat_template") or tok.chat_templates.get("default")
    operations = supported_operations(model)
    return pb.TokenizerInfo(
        fingerprint=tok.fingerprint,
        backend=tok.options.backend,
        backend_version=tok.backend.library_version,
        format="huggingface",
        model=model.name,
        served_names=served_names,
        vocab_size=tok.vocab_size,
        special_tokens=specials,
        defaults=option_defaults(tok),
        max_context_length=sp.model_max_length or 0,
        chat_template_sha256=hashlib.sha256(template.encode()).hexdigest() if template else "",
        chat_template_names=sorted(tok.chat_templates),
        artifacts=[
            pb.ArtifactFile(path=e.path, size=e.size, sha256=e.sha256) for e in tok.folder.entries
        ],
        supported_operations=operations,
        identity=tokenizer_identity(tok),
    )
