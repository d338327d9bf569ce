"""A loaded tokenizer: one folder, one backend, one fingerprint."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, TypeVar

from tokenkeys.errors import InvalidArgument
from tokenkeys.tokenizer.backends import Encoded, TokenizerBackend, Truncation, load_backend
from tokenkeys.tokenizer.fingerprint import fingerprint
from tokenkeys.tokenizer.folder import TokenizerFolder, read_folder
from tokenkeys.tokenizer.options import TokenizerOptions
from tokenkeys.tokenizer.specials import Specials, read_chat_templates, read_specials
from tokenkeys.tokenizer.splice_audit import SpliceDecision, splice_decision
from tokenkeys.tokenizer.token_floor import TokenFloor, token_floor

# How many preceding tokens give a token its context when decoding it alone: enough for a
# SentencePiece leading space and for a UTF-8 sequence split over up to four byte tokens.
_TOKEN_STR_CONTEXT = 4
#: How token strings are spelled: ``"decoded"``, each token's text in context (``" world"``, as
#: Dynamo reports it), or ``"vocabulary"``, its entry in the vocabulary (``"Ġworld"``,
#: ``"▁This"``: transformers' ``convert_ids_to_tokens``, what vLLM's /tokenize returns).
TokenStrs = Literal["decoded", "vocabulary"]
TOKEN_STRS: tuple[TokenStrs, ...] = ("decoded", "vocabulary")

_Decided = TypeVar("_Decided")

#: What was decided about a tokenizer, by (what, fingerprint), for the last few fingerprints.
#: The fingerprint names the files, the options and the backend's behaviour, everything these
#: decisions read (they are pure functions of them, and immutable), so a tokenizer loaded again
#: (a second model on the same folder, a reload, another server of the same process) reuses
#: them: about half of a load's CPU (token_floor 0.12 s and splice 0.1 s of 0.4 s for SmolLM2).
_DECIDED: OrderedDict[tuple[str, str], object] = OrderedDict()
_DECIDED_MAX = 16
_DECIDED_LOCK = threading.Lock()


def _decided(what: str, fp: str, decide: Callable[[], _Decided]) -> _Decided:
    """``decide()`` once per fingerprint (the last :data:`_DECIDED_MAX` kept)."""
    key = (what, fp)
    with _DECIDED_LOCK:
        if key in _DECIDED:
            _DECIDED.move_to_end(key)
            return _DECIDED[key]  # type: ignore[return-value]
    value = decide()  # outside the lock: two first loads at once both decide, alike
    with _DECIDED_LOCK:
        _DECIDED[key] = value
        while len(_DECIDED) > _DECIDED_MAX:
            _DECIDED.popitem(last=False)
    return value


@dataclass(frozen=True)
class Tokenizer:
    """A tokenizer folder loaded whole through one backend; immutable after :meth:`load`.

    Loading either yields a complete tokenizer or raises
    :class:`~tokenkeys.errors.TokenizerLoadError` naming the file and the cause.
    """

    folder: TokenizerFolder
    options: TokenizerOptions
    backend: TokenizerBackend
    specials: Specials
    chat_templates: dict[str, str]
    fingerprint: str

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], options: TokenizerOptions | None = None
    ) -> Tokenizer:
        """Read and load a tokenizer folder with the given behaviour options."""
        options = options or TokenizerOptions()
        folder = read_folder(path)
        backend = load_backend(
            options.backend, folder, split_special_tokens=options.split_special_tokens
        )
        specials = read_specials(folder, backend)
        templates = read_chat_templates(folder)
        fp = fingerprint(folder.entries, options, backend.behaviour)
        return cls(folder, options, backend, specials, templates, fp)

    @cached_property
    def token_floor(self) -> TokenFloor | None:
        """A sound floor on a text's tokens from its size, where this tokenizer allows one.

        Only for the ``tokenizers`` backend, which encodes tokenizer.json exactly as read;
        transformers may rebuild parts of the pipeline from class defaults.
        """
        if self.backend.name != "tokenizers":
            return None
        contents = self.folder.contents["tokenizer.json"]
        return _decided("token_floor", self.fingerprint, lambda: token_floor(contents))

    @cached_property
    def splice(self) -> SpliceDecision:
        """Where this tokenizer's texts may be cut and encoded piece by piece, exactly; or why not.

        Decided once from the pipeline the backend runs and checked on probe texts against it
        (:mod:`tokenkeys.tokenizer.splice_audit`).
        """

        def encode(texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
            encoded = self.backend.encode_batch(
                texts, add_special_tokens=add_special_tokens, offsets=False
            )
            return [e.ids for e in encoded]

        return _decided(
            "splice",
            self.fingerprint,
            lambda: splice_decision(
                self.backend.pipeline_json(),
                split_special_tokens=self.options.split_special_tokens,
                encode=encode,
            ),
        )

    @property
    def vocab_size(self) -> int:
        """Number of valid ids, added tokens included."""
        return self.backend.vocab_size()

    def encode(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool,
        offsets: bool = False,
        truncation: Truncation | None = None,
    ) -> list[Encoded]:
        """Encode texts exactly as the backend does; no normalization happens here."""
        if truncation is not None:
            floor = self.backend.num_special_tokens() if add_special_tokens else 0
            if truncation.max_tokens < max(floor, 1) or truncation.side not in ("left", "right"):
                raise InvalidArgument(
                    f"truncation.max_tokens must be at least {max(floor, 1)} (the special "
                    f"tokens added) and side 'left' or 'right'; got {truncation.max_tokens}, "
                    f"{truncation.side!r}",
                    field="truncation",
                )
        return self.backend.encode_batch(
            texts, add_special_tokens=add_special_tokens, offsets=offsets, truncation=truncation
        )

    def check_ids(self, sequences: Sequence[Sequence[int]], field: str = "ids") -> None:
        """Raise InvalidArgument naming the first id outside the vocabulary and its position."""
        size = self.vocab_size
        for seq_index, seq in enumerate(sequences):
            for pos, token_id in enumerate(seq):
                if not 0 <= token_id < size:
                    raise InvalidArgument(
                        f"{field}[{seq_index}][{pos}] = {token_id} is outside the vocabulary "
                        f"(valid ids are 0..{size - 1})",
                        field=field,
                        index=seq_index,
                        position=pos,
                        id=token_id,
                    )

    def decode(self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool) -> list[str]:
        """Decode id sequences after checking every id is in the vocabulary."""
        self.check_ids(sequences)
        return self.backend.decode_batch(sequences, skip_special_tokens=skip_special_tokens)

    def token_strs(self, ids: Sequence[int], kind: TokenStrs = "decoded") -> list[str]:
        """Each token as a string: its decoded text in context (``" world"``), or with
        ``kind="vocabulary"`` its vocabulary entry (``"Ġworld"``, as ``convert_ids_to_tokens``).

        Each token's text is what decoding it adds after the few tokens before it, so that
        leading spaces survive SentencePiece decoders that strip them at sequence start. Bytes
        of a character split over several tokens decode as U+FFFD on the incomplete tokens.
        """
        self.check_ids([ids])
        if kind == "vocabulary":
            return [self.backend.id_to_token(i) or "" for i in ids]
        windows: list[list[int]] = []
        for i in range(len(ids)):
            start = max(0, i - _TOKEN_STR_CONTEXT)
            windows.append(list(ids[start:i]))
            windows.append(list(ids[start : i + 1]))
        texts = self.backend.decode_batch(windows, skip_special_tokens=False)
        out = []
        for i in range(len(ids)):
            before, with_token = texts[2 * i], texts[2 * i + 1]
            if with_token.startswith(before):
                out.append(with_token[len(before) :])
            else:
                out.append(self.backend.decode_batch([[ids[i]]], skip_special_tokens=False)[0])
        return out
