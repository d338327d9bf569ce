"""Token ids as vocabulary pieces, and pieces joined into text, as transformers 5 does it.

vLLM 0.32 derenders with its slow incremental detokenizer, which calls three tokenizer methods
of transformers 5 (``tokenization_utils_tokenizers.py``, 5.19): ``convert_ids_to_tokens`` (the
vocabulary piece of each id, special ids left out when ``skip_special_tokens``), and
``convert_tokens_to_string`` (the pipeline's decoder run on the pieces, no clean-up). "Special"
there is ``all_special_ids``: the tokens named by the seven roles (bos, eos, unk, sep, pad, cls,
mask), the extra special tokens (``extra_special_tokens``, formerly
``additional_special_tokens``) and other ``*_token`` entries of tokenizer_config.json, not every
added token the tokenizer.json marks special (decoding with the tokenizers library skips
those: the two differ on e.g. SmolLM2's ``<repo_name>``).

:class:`Pieces` is built on the tokenizer's own pipeline (the tokenizer.json the backend runs);
a backend without one (``transformers``) is refused, never approximated.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from tokenkeys.errors import Unsupported
from tokenkeys.tokenizer.tokenizer import Tokenizer

#: transformers 5's ``SPECIAL_TOKENS_ATTRIBUTES``.
_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def _content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def special_tokens(config: Mapping[str, Any], smap: Mapping[str, Any]) -> list[str]:
    """transformers 5's ``all_special_tokens`` of a folder's tokenizer_config.json (``config``)
    and special_tokens_map.json (``smap``): the config's entries win, as at load."""
    merged = {**smap, **config}
    out: list[str] = []
    for role in _ROLES:
        token = _content(merged.get(f"{role}_token"))
        if token:
            out.append(token)
    extra = merged.get("extra_special_tokens")
    if extra is None:
        extra = merged.get("additional_special_tokens")
    if isinstance(extra, Mapping):
        extra = list(extra.values())
    for token in extra or []:
        if (text := _content(token)) is not None:
            out.append(text)
    for key, value in config.items():
        named = key.endswith("_token") and key[: -len("_token")] not in _ROLES
        if named and isinstance(value, str):
            out.append(value)
    return list(dict.fromkeys(out))


def space_marker(pipeline_json: str) -> str | None:
    """The Metaspace replacement character of a pipeline's pre-tokenizer (vLLM's
    ``get_leading_space_marker``), or None when decoding a single token keeps its spaces."""
    pre = json.loads(pipeline_json).get("pre_tokenizer") or {}
    if pre.get("type") == "Metaspace":
        return pre.get("replacement", "▁")
    if pre.get("type") == "Sequence":
        for sub in pre.get("pretokenizers", []):
            if sub.get("type") == "Metaspace":
                return sub.get("replacement", "▁")
    return None


class Pieces:
    """One tokenizer's pieces and piece decoder; see the module doc."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        pipeline = tokenizer.backend.pipeline_json()
        if pipeline is None:
            raise Unsupported(
                f"derender needs the tokenizer pipeline the engine decodes with; backend "
                f"{tokenizer.backend.name!r} runs steps of its own (serve with --backend "
                "transformers5, vLLM 0.32's)",
                field="model",
            )
        import tokenizers

        self._tok = tokenizers.Tokenizer.from_str(pipeline)
        #: The Metaspace character a single-token decode strips at the start (None: none).
        self.marker = space_marker(pipeline)
        self._lock = threading.Lock()  # one Rust tokenizer, shared by worker threads
        self.size = tokenizer.vocab_size
        folder = tokenizer.folder
        names = special_tokens(
            folder.json("tokenizer_config.json"), folder.json("special_tokens_map.json")
        )
        ids = [self._tok.token_to_id(n) for n in names]
        self.special_ids = frozenset(i for i in ids if i is not None)

    def of(self, ids: Sequence[int], *, skip_special_tokens: bool) -> list[str]:
        """``convert_ids_to_tokens(ids)``: each id's piece ("" for an id without one)."""
        skip = self.special_ids if skip_special_tokens else frozenset()
        with self._lock:
            return [self._tok.id_to_token(i) or "" for i in ids if i not in skip]

    def piece(self, token_id: int) -> str | None:
        """The id's vocabulary piece, None without one."""
        with self._lock:
            return self._tok.id_to_token(token_id)

    def text(self, pieces: Sequence[str]) -> str:
        """``convert_tokens_to_string(pieces)``: the decoder on the pieces (joined by spaces
        without one)."""
        if not pieces:
            return ""
        with self._lock:
            decoder = self._tok.decoder
            return decoder.decode(list(pieces)) if decoder is not None else " ".join(pieces)


_CACHE: dict[str, Pieces] = {}
_CACHE_LOCK = threading.Lock()


def pieces_of(tokenizer: Tokenizer) -> Pieces:
    """The tokenizer's :class:`Pieces` (built once per fingerprint)."""
    with _CACHE_LOCK:
        found = _CACHE.get(tokenizer.fingerprint)
        if found is None:
            found = _CACHE[tokenizer.fingerprint] = Pieces(tokenizer)
        return found
