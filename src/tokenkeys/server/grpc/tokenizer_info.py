"""The tokenizer answers about one served model: TokenizerInfo and its supported operations.

The identity inside comes from :mod:`tokenkeys.tokenizer.proto`; the chat template reported is
the one generation renders with (:attr:`ServedModel.chat_template`: the ``--chat-template``
override when there is one), as the HTTP ``/tokenizer_info`` reports it.
"""

from __future__ import annotations

import hashlib

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.serving.models import ServedModel
from tokenkeys.tokenizer.proto import option_defaults, tokenizer_identity


def supported_operations(model: ServedModel) -> list[int]:
    """The OpenEngineTokenizer operations served for ``model`` (TokenizerOperation values)."""
    operations = [pb.TOKENIZER_OPERATION_TOKENIZE, pb.TOKENIZER_OPERATION_DETOKENIZE]
    if model.artifacts is not None:
        operations.append(pb.TOKENIZER_OPERATION_ARTIFACTS)
    if model.cache_keys is not None:
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
    template = model.chat_template
    operations = supported_operations(model)
    encoder = model.preprocessor.encoder
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
        incremental_tokenization=pb.IncrementalTokenization(
            enabled=encoder.enabled,
            reason=encoder.reason,
            max_bytes=encoder.options.max_bytes,
            verify_every=encoder.options.verify_every,
        ),
    )
