"""The Preprocessor: the one path from a request to the token ids an engine receives.

One instance per served model is shared by every consumer: generation (/v1/completions,
/v1/chat/completions, Inference.Generate) and every report of it (/tokenize, gRPC Tokenize).
Nothing else in tokenkeys calls a tokenizer's encode, so a count reported for a request is, by
construction, the count generation produces for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tokenkeys.errors import InvalidArgument, Unsupported, vllm_invalid
from tokenkeys.limits import Limits
from tokenkeys.preprocess import completion
from tokenkeys.preprocess.chat import (
    REUSED_IDS_FIELD,
    ChatOptions,
    ChatPrologue,
    ChatRender,
    reused_prompt_ids,
)
from tokenkeys.preprocess.chat_messages import IMAGE_PART_TYPES, media_kind
from tokenkeys.preprocess.images import ImageExpander, ImageOptions, MMFeature
from tokenkeys.preprocess.incremental import HistoryWatch, IncrementalEncoder, IncrementalOptions
from tokenkeys.preprocess.multimodal.processors import processor_class
from tokenkeys.preprocess.prompt_options import optional_flag
from tokenkeys.tokenizer import Tokenizer, TokenStrs, Truncation
from tokenkeys.tokenizer.specials import template_special_tokens

#: Above this many characters in all, a request's texts are encoded one by one (see
#: :meth:`Preprocessor.tokenize_prompts`); below it one batch is faster.
_ONE_BY_ONE_CHARS = 1 << 20


@dataclass(frozen=True, slots=True)
class Tokenized:
    """The ids of one text, with token strings and offsets when they were asked for."""

    ids: list[int]
    token_strs: list[str] | None = None
    offsets: list[tuple[int, int]] | None = None

    @property
    def count(self) -> int:
        return len(self.ids)


def _first_media(request: Mapping[str, Any], kinds: frozenset[str]) -> str | None:
    """Where the request's first content part of one of ``kinds`` is (``messages[i].content[j]``),
    or None."""
    messages = request.get("messages") if isinstance(request, Mapping) else None
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if media_kind(part) in kinds:
                return f"messages[{i}].content[{j}]"
    return None


def _strip_nul(text: str) -> tuple[str, list[int] | None]:
    """Remove NUL characters; return the text and, if any were removed, a map to original indices.

    The map sends each index of the stripped text (and its end) to the original text, so
    offsets reported to the caller refer to the text the caller sent.
    """
    if "\x00" not in text:
        return text, None
    kept = [i for i, ch in enumerate(text) if ch != "\x00"]
    kept.append(len(text))
    return text.replace("\x00", ""), kept


@dataclass(frozen=True, slots=True)
class ChatTokenized:
    """A rendered chat: the prompt text the template produced and its tokens.

    ``prompt`` is None when the request carried its ids (token-in chat: nothing rendered).
    """

    prompt: str | None
    tokens: Tokenized
    features: tuple[MMFeature, ...] = ()


@dataclass
class Preprocessor:
    """Normalize, template, encode: shared by generation and by every tokenize report.

    ``add_special_tokens=None`` means the served default for that path, read from the
    tokenizer's options (which are part of its fingerprint). Every encode goes through the
    exact incremental cache (:mod:`tokenkeys.preprocess.incremental`) set by ``incremental``;
    ``model`` names the served model in its log lines. A tokenizer folder carrying a multimodal
    processor's configs takes images (:mod:`tokenkeys.preprocess.images`) under ``images``.
    """

    tokenizer: Tokenizer
    limits: Limits = field(default_factory=Limits)
    chat_options: ChatOptions = field(default_factory=ChatOptions)
    incremental: IncrementalOptions = field(default_factory=IncrementalOptions)
    model: str = ""
    images: ImageOptions = field(default_factory=ImageOptions)

    def __post_init__(self) -> None:
        self.image_expander: ImageExpander | None = None
        self._image_refusal: Unsupported | None = None
        placeholder = None
        root = self.tokenizer.folder.root
        #: No processor configs beside the tokenizer: media parts get vLLM's 400.
        self._text_only = processor_class(root) is None
        if not self._text_only:
            try:
                expander = ImageExpander(root, self.images)
                placeholder = expander.family.placeholder
                self.image_expander = expander
            except Unsupported as exc:
                self._image_refusal = exc
        self.chat = ChatPrologue(
            self.tokenizer.chat_templates,
            template_special_tokens(self.tokenizer.folder),
            self.chat_options,
            image_placeholder=placeholder,
        )
        self.encoder = IncrementalEncoder(self.tokenizer, self.incremental)
        self.history = HistoryWatch(self.model)

    def adopt_image_model_id(self, model_id: str | None) -> None:
        """Hash images with ``model_id`` from now on: the engine reported its ``--model``
        argument (the vLLM sidecar, where ``--mm-model-id`` was not given; the router, from its
        workers). None: no longer known, image prompts get no identifiers (and no keys)."""
        self.images = replace(self.images, model_id=model_id)
        if self.image_expander is not None:
            self.image_expander.options = self.images

    def normalize(self, text: str, nul: str | None = None) -> tuple[str, list[int] | None]:
        """Apply the text normalization of this deployment (NUL handling)."""
        if (nul or self.tokenizer.options.nul) == "strip":
            return _strip_nul(text)
        return text, None

    def tokenize_prompts(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool | None = None,
        truncation: Truncation | None = None,
        nul: str | None = None,
        offsets: bool = False,
        token_strs: bool | TokenStrs = False,
        field_name: str = "texts",
    ) -> list[Tokenized]:
        """Encode bare prompts exactly as /v1/completions sends them to the engine.

        ``token_strs`` asks for each token's string: ``True`` or ``"decoded"`` for its text in
        context, ``"vocabulary"`` for its vocabulary entry (:meth:`Tokenizer.token_strs`).
        """
        limits = self.limits
        limits.check_count(field_name, len(texts))
        if nul not in (None, "keep", "strip"):
            raise InvalidArgument(f"nul handling {nul!r} is not 'keep' or 'strip'", field="nul")
        normalized: list[str] = []
        maps: list[list[int] | None] = []
        floor = self.tokenizer.token_floor
        for i, text in enumerate(texts):
            limits.check_chars(field_name, i, len(text))
            norm, index_map = self.normalize(text, nul)
            # Before any encoding: a text certain to become too many tokens costs a byte count.
            if floor is not None and 4 * len(norm) > limits.max_tokens_per_text * floor.divisor:
                limits.check_token_floor(field_name, i, floor.tokens_at_least(norm))
            normalized.append(norm)
            maps.append(index_map)
        if add_special_tokens is None:
            add_special_tokens = self.tokenizer.options.add_special_tokens_completion
        options = {
            "add_special_tokens": add_special_tokens,
            "offsets": offsets,
            "truncation": truncation,
        }
        if len(normalized) > 1 and sum(len(t) for t in normalized) > _ONE_BY_ONE_CHARS:
            # Large texts one at a time, each checked as it is done, so a request over a token
            # limit is refused after the text that crosses it, not after encoding them all.
            encoded = []
            total = 0
            for i, text in enumerate(normalized):
                (enc,) = self.encoder.encode([text], **options)  # type: ignore[arg-type]
                limits.check_text_tokens(field_name, i, len(enc.ids))
                total += len(enc.ids)
                limits.check_tokens(field_name, total)
                encoded.append(enc)
        else:
            encoded = self.encoder.encode(normalized, **options)  # type: ignore[arg-type]
            limits.check_sequences(field_name, [len(e.ids) for e in encoded])
        results = []
        for enc, index_map in zip(encoded, maps, strict=True):
            spans = enc.offsets
            if spans is not None and index_map is not None:
                spans = [
                    (index_map[s], index_map[e - 1] + 1) if e > s else (s, e) for s, e in spans
                ]
            strs = self._strs(enc.ids, token_strs)
            results.append(Tokenized(enc.ids, strs, spans))
        return results

    def _strs(self, ids: list[int], token_strs: bool | TokenStrs) -> list[str] | None:
        if not token_strs:
            return None
        return self.tokenizer.token_strs(ids, "decoded" if token_strs is True else token_strs)

    def tokenize_completion(
        self, request: Mapping[str, Any], *, token_strs: bool | TokenStrs = False
    ) -> list[Tokenized]:
        """The prompts of a completion request (OpenAI/vLLM body as a dict) as the engine gets them.

        Texts are encoded by :meth:`tokenize_prompts` with the request's ``add_special_tokens``
        (unset: the served default); token-id prompts pass through unchanged after a
        vocabulary check. What cannot be built exactly is refused by
        :func:`tokenkeys.preprocess.completion.unsupported_reason`. /v1/completions and the
        completion form of /tokenize both call this one method.
        """
        reason = completion.unsupported_reason(request)
        if reason is not None:
            raise Unsupported(reason)
        prompts = completion.prompts_of(request)
        add_special_tokens = optional_flag(request, "add_special_tokens")
        if all(isinstance(p, str) for p in prompts):
            return self.tokenize_prompts(
                prompts,  # type: ignore[arg-type]  # all texts, checked above
                add_special_tokens=add_special_tokens,
                token_strs=token_strs,
                field_name="prompt",
            )
        # prompts_of never mixes texts and id lists.
        id_prompts = [list(p) for p in prompts]  # type: ignore[arg-type]
        self.limits.check_sequences("prompt", [len(p) for p in id_prompts])
        self.tokenizer.check_ids(id_prompts, field="prompt")
        return [Tokenized(ids, self._strs(ids, token_strs)) for ids in id_prompts]

    def tokenize_chat(
        self,
        request: Mapping[str, Any],
        *,
        add_special_tokens: bool | None = None,
        token_strs: bool | TokenStrs = False,
    ) -> ChatTokenized:
        """Render a chat request (OpenAI/vLLM body as a dict) and encode it.

        ``add_special_tokens`` unset takes the request's field of that name, then the served
        chat default.

        The chat prologue (content parts, tool calls, template kwargs defaults, template
        selection) and the 501 checks for what generation cannot do exactly all live in
        :class:`~tokenkeys.preprocess.chat.ChatPrologue`; both /v1/chat/completions and
        /tokenize call this one method, so they cannot disagree. A request carrying
        ``kv_transfer_params.prompt_token_ids`` is validated the same way, then served those
        ids unrendered, as vLLM 0.32 serves them
        (:func:`~tokenkeys.preprocess.chat.reused_prompt_ids`).
        """
        messages = request.get("messages") if isinstance(request, Mapping) else None
        if isinstance(messages, list):
            # Before rendering: a conversation over the limit costs no template work.
            self.limits.check_messages("messages", len(messages))
        where = _first_media(request, IMAGE_PART_TYPES)
        if where is not None and self._image_refusal is not None:
            raise self._image_refusal
        if where is not None and self._text_only:
            # vLLM 0.32's answer, before it fetches anything (see IMAGE_PART_TYPES).
            raise InvalidArgument(
                f"{self.model or 'the model'} is not a multimodal model (media part at {where})",
                field=where,
            )
        chat = self.chat.prepare(request)
        reused = None if chat.images else reused_prompt_ids(request)
        if reused is not None:
            self.limits.check_sequences(REUSED_IDS_FIELD, [len(reused)])
            self._check_vocabulary(reused)
            return ChatTokenized(None, Tokenized(reused, self._strs(reused, token_strs)))
        prompt = self.chat.render(chat)
        self._watch_history(chat, prompt)
        if add_special_tokens is None:
            add_special_tokens = optional_flag(request, "add_special_tokens")
        if add_special_tokens is None:
            add_special_tokens = self.tokenizer.options.add_special_tokens_chat
        if chat.images:
            if self.image_expander is None:
                raise Unsupported("images are not supported by this model", field="messages")
            # Counted before expansion too: the expansion only grows the prompt.
            self.image_expander.check_count(chat.images)
        result = self.tokenize_prompts(
            [prompt],
            add_special_tokens=add_special_tokens,
            token_strs=False if chat.images else token_strs,
            field_name="messages",
        )[0]
        if not chat.images:
            return ChatTokenized(prompt, result)
        return self._expand_images(prompt, result.ids, chat, token_strs)

    def _expand_images(
        self, prompt: str, ids: list[int], chat: ChatRender, token_strs: bool | TokenStrs
    ) -> ChatTokenized:
        """The prompt with each image placeholder replaced by the processor's expansion."""
        expander = self.image_expander
        assert expander is not None  # checked by the caller
        placeholder = expander.family.placeholder
        placeholder_id = self.tokenizer.backend.token_to_id(placeholder)
        if placeholder_id is None:
            raise Unsupported(
                f"the tokenizer has no {placeholder} token for the processor's image placeholder",
                field="messages",
            )

        def encode(text: str) -> list[int]:
            (enc,) = self.encoder.encode([text], add_special_tokens=False)
            return enc.ids

        expanded, features = expander.expand(ids, chat.images, encode, placeholder_id)
        self.limits.check_sequences("messages", [len(expanded)])
        return ChatTokenized(
            prompt, Tokenized(expanded, self._strs(expanded, token_strs)), tuple(features)
        )

    def _watch_history(self, chat: ChatRender, prompt: str) -> None:
        if chat.images:
            return  # the history watch compares texts; an image's text is its placeholder
        context = {
            "template": chat.template,
            "tools": chat.tools,
            "documents": chat.documents,
            "variables": chat.variables,
            "add_generation_prompt": chat.add_generation_prompt,
            "continue_final_message": chat.continue_final_message,
        }
        self.history.observe(context, chat.messages, prompt)

    def _check_vocabulary(self, ids: list[int]) -> None:
        # vLLM's BaseRenderer.validate_token_ids message and parameter (0.32).
        top = max(ids)
        if top >= self.tokenizer.vocab_size:
            raise vllm_invalid(f"Token id {top} is out of vocabulary", REUSED_IDS_FIELD)

    def detokenize(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        skip_special_tokens: bool | None = None,
        field_name: str = "sequences",
    ) -> list[str]:
        """Decode id sequences; unset ``skip_special_tokens`` keeps special tokens (vLLM)."""
        self.limits.check_sequences(field_name, [len(s) for s in sequences])
        self.tokenizer.check_ids(sequences, field=field_name)
        return self.tokenizer.backend.decode_batch(
            sequences, skip_special_tokens=bool(skip_special_tokens)
        )
