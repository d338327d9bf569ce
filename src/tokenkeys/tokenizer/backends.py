"""Tokenizer backends: the library that turns text into ids, behind one small interface.

Three backends exist because they can disagree on the same files, and the service must
reproduce the one its engine uses:

- ``tokenizers``: the Rust ``tokenizers`` library on tokenizer.json, loaded from the exact bytes
  that were fingerprinted. This is what Rust frontends (Dynamo, SMG, TGI) serve.
- ``transformers5``: what transformers 5 builds from the folder (the class named in
  tokenizer_config.json rebuilds the pipeline from its own defaults; see
  :mod:`tokenkeys.tokenizer.transformers5`), reproduced on the ``tokenizers`` library, so it does
  not depend on which transformers is installed. This is what vLLM 0.32 serves (transformers
  5.19), proven against it live in tests/realengine.
- ``transformers``: ``AutoTokenizer.from_pretrained(folder)`` of the installed transformers,
  which is what vLLM and SGLang call (vLLM ``vllm/tokenizers/hf.py``); for classes the
  ``transformers5`` table does not know (e.g. SentencePiece-style Llama folders, whose
  normalizer transformers 5 rebuilds so that phi-3 differs from tokenizer.json on spaces).
  Its results follow the installed release, hence its major version in the behaviour string.

The backend is part of the fingerprint.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from tokenkeys.errors import TokenizerLoadError
from tokenkeys.tokenizer import transformers5
from tokenkeys.tokenizer.folder import TokenizerFolder


@dataclass(frozen=True, slots=True)
class Truncation:
    """Keep at most ``max_tokens`` ids, dropping from the ``side`` end ("left" or "right")."""

    max_tokens: int
    side: str = "right"


@dataclass(frozen=True, slots=True)
class Encoded:
    """Ids of one encoded text and, on request, each token's character span in that text."""

    ids: list[int]
    offsets: list[tuple[int, int]] | None = None


class TokenizerBackend(Protocol):
    """What the service needs from a tokenizer library."""

    name: str
    library_version: str
    behaviour: str
    """Enters the fingerprint: the backend name, tokenkeys' own behaviour version for it (bumped
    when tokenkeys changes how it calls the library) and, where the library's major version
    changes results, that major version."""

    def vocab_size(self) -> int:
        """Number of ids, added tokens included (ids are ``0 .. vocab_size-1``)."""
        ...

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool,
        offsets: bool,
        truncation: Truncation | None = None,
    ) -> list[Encoded]:
        """Encode several texts; ids exactly as the library produces them.

        With ``truncation``, the content is cut first and the special tokens are added after,
        so the result never exceeds ``truncation.max_tokens`` and keeps its BOS/EOS (the
        semantics of transformers' single-sequence truncation).
        """
        ...

    def num_special_tokens(self) -> int:
        """How many special tokens ``add_special_tokens=True`` adds to a single sequence."""
        ...

    def decode_batch(
        self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool
    ) -> list[str]:
        """Decode several id sequences to text."""
        ...

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary spelling of an id (``Ġworld``), or None when out of range."""
        ...

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary spelling or added token, or None when unknown."""
        ...

    def pipeline_json(self) -> str | None:
        """The tokenizer.json of the pipeline the library runs, as it loaded it; None when the
        backend runs steps of its own around the library."""
        ...


class _LoadedCounts:
    """The two counts both libraries' backends read once at load and answer from then on."""

    _vocab_size: int
    _num_special: int

    def vocab_size(self) -> int:
        return self._vocab_size

    def num_special_tokens(self) -> int:
        return self._num_special


class TokenizersBackend(_LoadedCounts):
    """The Rust ``tokenizers`` library on tokenizer.json."""

    name = "tokenizers"
    behaviour = "tokenizers/1"

    def __init__(
        self,
        folder: TokenizerFolder,
        *,
        split_special_tokens: bool = False,
        tokenizer_json: str | None = None,
    ) -> None:
        """Load tokenizer.json of ``folder``, or ``tokenizer_json`` (text derived from it)."""
        import tokenizers

        self.library_version = tokenizers.__version__
        if tokenizer_json is None:
            tokenizer_json = folder.contents["tokenizer.json"].decode("utf-8")
        try:
            self._tok = tokenizers.Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # the library raises bare Exception with its parser message
            raise TokenizerLoadError(
                f"{folder.root / 'tokenizer.json'}: the tokenizers library refuses it: {exc}",
                field="tokenizer.json",
            ) from exc
        # Parsing special-token text typed by a user as the special id is the default of both
        # transformers and tokenizers; split_special_tokens turns it off for the whole server.
        self._tok.encode_special_tokens = split_special_tokens
        self._vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._num_special = self._tok.num_special_tokens_to_add(False)

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool,
        offsets: bool,
        truncation: Truncation | None = None,
    ) -> list[Encoded]:
        specials_now = add_special_tokens and truncation is None
        # The batch calls even for one text: tokenizers 0.23's encode holds the GIL for the whole
        # encode (a 4 MB prompt froze the event loop for 3 s) while both batch calls release it
        # (bindings/python/src/tokenizer.rs, py.allow_threads). Without offsets, encode_batch_fast
        # skips tracking them (tokenizers' encode_fast): same ids, a quarter less CPU at 1k
        # tokens (907 -> 685 us, smollm2). Parity: tests/tokenizer/test_tokenizer_encode_off_gil.py.
        encode = self._tok.encode_batch if offsets else self._tok.encode_batch_fast
        encs = encode(list(texts), add_special_tokens=specials_now)
        if truncation is not None:
            room = truncation.max_tokens - (self._num_special if add_special_tokens else 0)
            for enc in encs:
                enc.truncate(room, direction=truncation.side)
            if add_special_tokens:
                encs = [self._tok.post_process(e, None, add_special_tokens=True) for e in encs]
        if offsets:
            return [Encoded(e.ids, [tuple(o) for o in e.offsets]) for e in encs]
        return [Encoded(e.ids) for e in encs]

    def decode_batch(
        self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool
    ) -> list[str]:
        return self._tok.decode_batch(
            [list(s) for s in sequences], skip_special_tokens=skip_special_tokens
        )

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def pipeline_json(self) -> str | None:
        # The library's own serialization: every flag as it runs (defaults filled in).
        return self._tok.to_str()


class Transformers5Backend(TokenizersBackend):
    """The folder as transformers 5 builds it (checked: 5.19.0), on the ``tokenizers`` library.

    A folder whose tokenizer class :mod:`~tokenkeys.tokenizer.transformers5` does not know is
    refused at load, never approximated.
    """

    name = "transformers5"
    # Bump the number when the reproduction changes what a folder tokenizes to.
    behaviour = f"transformers5/1;checked={transformers5.CHECKED_RELEASE}"

    def __init__(self, folder: TokenizerFolder, *, split_special_tokens: bool = False) -> None:
        rebuilt = transformers5.rebuild(folder)
        super().__init__(
            folder, split_special_tokens=split_special_tokens, tokenizer_json=rebuilt.tokenizer_json
        )
        self._clean_up_spaces = rebuilt.clean_up_spaces

    def decode_batch(
        self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool
    ) -> list[str]:
        texts = super().decode_batch(sequences, skip_special_tokens=skip_special_tokens)
        if self._clean_up_spaces:
            return [transformers5.clean_up_tokenization(t) for t in texts]
        return texts


class TransformersBackend(_LoadedCounts):
    """transformers' ``AutoTokenizer`` on the folder, as vLLM and SGLang load it."""

    name = "transformers"

    def __init__(self, folder: TokenizerFolder, *, split_special_tokens: bool = False) -> None:
        try:
            import transformers
        except ImportError as exc:
            raise TokenizerLoadError(
                "backend 'transformers' needs the optional extra: "
                "pip install 'tokenkeys[transformers]'",
                field="backend",
            ) from exc
        self.library_version = transformers.__version__
        # transformers 5 rebuilt SentencePiece normalizers from class defaults: results differ
        # between majors on the same files, so the major is part of the identity.
        self.behaviour = f"transformers/1;major={transformers.__version__.split('.')[0]}"
        try:
            self._tok = transformers.AutoTokenizer.from_pretrained(
                str(folder.root), local_files_only=True, split_special_tokens=split_special_tokens
            )
        except Exception as exc:  # transformers raises many types; all mean "does not load"
            raise TokenizerLoadError(
                f"{folder.root}: transformers.AutoTokenizer refuses the folder: "
                f"{type(exc).__name__}: {exc}",
                field="tokenizer.json",
            ) from exc
        self._vocab_size = len(self._tok)
        self._num_special = self._tok.num_special_tokens_to_add(pair=False)
        # Every call sets the shared Rust tokenizer's truncation (on or off) before it encodes,
        # so two calls on worker threads (large requests encode off the event loop) could
        # encode with each other's settings, or fail with "Already borrowed": one at a time.
        self._lock = threading.Lock()

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool,
        offsets: bool,
        truncation: Truncation | None = None,
    ) -> list[Encoded]:
        kwargs = {}
        if truncation is not None:
            kwargs = {"truncation": True, "max_length": truncation.max_tokens}
        with self._lock, self._truncation_side(truncation):
            out = self._tok(
                list(texts),
                add_special_tokens=add_special_tokens,
                return_offsets_mapping=offsets,
                return_attention_mask=False,
                **kwargs,
            )
        if offsets:
            return [
                Encoded(list(ids), [tuple(o) for o in offs])
                for ids, offs in zip(out["input_ids"], out["offset_mapping"], strict=True)
            ]
        return [Encoded(list(ids)) for ids in out["input_ids"]]

    @contextlib.contextmanager
    def _truncation_side(self, truncation: Truncation | None) -> Iterator[None]:
        """transformers reads the side from the shared tokenizer: set it (under the lock)."""
        if truncation is None:
            yield
            return
        saved = self._tok.truncation_side
        self._tok.truncation_side = truncation.side
        try:
            yield
        finally:
            self._tok.truncation_side = saved

    def decode_batch(
        self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool
    ) -> list[str]:
        return [
            self._tok.decode(list(s), skip_special_tokens=skip_special_tokens) for s in sequences
        ]

    def id_to_token(self, token_id: int) -> str | None:
        if not 0 <= token_id < self._vocab_size:
            return None
        return self._tok.convert_ids_to_tokens(token_id)

    def token_to_id(self, token: str) -> int | None:
        token_id = self._tok.convert_tokens_to_ids(token)
        return (
            None
            if token_id is None
            or token_id == self._tok.unk_token_id
            and token != self._tok.unk_token
            else token_id
        )

    def pipeline_json(self) -> str | None:
        return None


def load_backend(
    name: str, folder: TokenizerFolder, *, split_special_tokens: bool = False
) -> TokenizerBackend:
    """Construct the named backend on a folder; errors name the file and the cause."""
    if name == "tokenizers":
        return TokenizersBackend(folder, split_special_tokens=split_special_tokens)
    if name == "transformers5":
        return Transformers5Backend(folder, split_special_tokens=split_special_tokens)
    if name == "transformers":
        return TransformersBackend(folder, split_special_tokens=split_special_tokens)
    raise TokenizerLoadError(
        f"unknown backend {name!r}; use 'tokenizers', 'transformers5' or 'transformers'",
        field="backend",
    )
