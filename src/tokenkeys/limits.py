"""Configurable request limits, checked at the one place every path passes through."""

from __future__ import annotations

from dataclasses import dataclass, fields

from tokenkeys.errors import ConfigError, LimitExceeded

#: The largest gRPC answer a tokenkeys client accepts (gRPC's default is 4 MiB): a cache-key
#: spec with its vectors, the TokenizerInfo of a large vocabulary. Servers refuse to build a
#: larger one rather than send what no client receives.
MAX_ANSWER_BYTES = 64 * 1024 * 1024


def check_option_fields(instance: object, zero_means_off: frozenset[str] = frozenset()) -> None:
    """Refuse a field of a dataclass of options that is not a positive number of its kind.

    A field whose default is an int takes ints only; a float field takes ints too. Fields in
    ``zero_means_off`` may be 0. The error names the field and its command-line option.
    """
    for f in fields(instance):  # type: ignore[arg-type]
        value = getattr(instance, f.name)
        kind = int if isinstance(f.default, int) else (int, float)
        floor_ok = value >= 0 if f.name in zero_means_off else value > 0
        if isinstance(value, bool) or not isinstance(value, kind) or not floor_ok:
            what = "an integer" if kind is int else "a number"
            bound = ">= 0" if f.name in zero_means_off else "> 0"
            option = "--" + f.name.replace("_", "-")
            raise ConfigError(
                f"{f.name} must be {what} {bound}, got {value!r}; fix {option}", field=f.name
            )


@dataclass(frozen=True)
class Limits:
    """Upper bounds on what one request (or one client) may ask for; each is a server option.

    - ``max_request_bytes``: size of one gRPC message or HTTP body.
    - ``max_texts_per_request``: texts in one Tokenize call, sequences in one Detokenize call,
      prompts in one completion request.
    - ``max_chars_per_text``: characters of one text (checked before encoding, so a huge text
      costs nothing).
    - ``max_tokens_per_text``: ids of one text or sequence.
    - ``max_tokens_per_request``: ids produced or submitted by one request, all texts together.
    - ``max_messages_per_conversation``: messages of one chat request.
    - ``max_streams_per_client``: streaming calls (gRPC server streams, HTTP streamed answers)
      one client address may hold open at once; 0 means no limit.
    """

    max_request_bytes: int = 16 * 1024 * 1024
    max_texts_per_request: int = 1024
    max_chars_per_text: int = 4 * 1024 * 1024
    max_tokens_per_text: int = 1_048_576
    max_tokens_per_request: int = 1_048_576
    max_messages_per_conversation: int = 4096
    max_streams_per_client: int = 1024

    def __post_init__(self) -> None:
        check_option_fields(self, zero_means_off=frozenset({"max_streams_per_client"}))

    def check_count(self, field: str, count: int) -> None:
        """Refuse more than ``max_texts_per_request`` items in ``field``."""
        if count > self.max_texts_per_request:
            raise LimitExceeded(
                f"{field} has {count} items; at most {self.max_texts_per_request} are allowed "
                "per request (max_texts_per_request): split the request",
                field=field,
                limit=self.max_texts_per_request,
            )

    def check_chars(self, field: str, index: int, length: int) -> None:
        """Refuse a text longer than ``max_chars_per_text``."""
        if length > self.max_chars_per_text:
            raise LimitExceeded(
                f"{field}[{index}] has {length} characters; at most {self.max_chars_per_text} "
                "are allowed per text (max_chars_per_text)",
                field=field,
                limit=self.max_chars_per_text,
            )

    def check_text_tokens(self, field: str, index: int, count: int) -> None:
        """Refuse one text or sequence of more than ``max_tokens_per_text`` ids."""
        if count > self.max_tokens_per_text:
            raise LimitExceeded(
                f"{field}[{index}] amounts to {count} tokens; at most {self.max_tokens_per_text} "
                "are allowed per text (max_tokens_per_text): shorten or split it",
                field=field,
                limit=self.max_tokens_per_text,
            )

    def check_token_floor(self, field: str, index: int, floor: int) -> None:
        """Refuse a text certain, before encoding, to exceed ``max_tokens_per_text``.

        ``floor`` is a sound lower bound on its tokens (:mod:`tokenkeys.tokenizer.token_floor`).
        """
        if floor > self.max_tokens_per_text:
            raise LimitExceeded(
                f"{field}[{index}] is too long to fit: by its size it becomes at least {floor} "
                f"tokens; at most {self.max_tokens_per_text} are allowed per text "
                "(max_tokens_per_text): shorten or split it",
                field=field,
                limit=self.max_tokens_per_text,
            )

    def check_tokens(self, field: str, total: int) -> None:
        """Refuse a request whose ids add up to more than ``max_tokens_per_request``."""
        if total > self.max_tokens_per_request:
            raise LimitExceeded(
                f"{field} amounts to {total} tokens; at most {self.max_tokens_per_request} are "
                "allowed per request (max_tokens_per_request)",
                field=field,
                limit=self.max_tokens_per_request,
            )

    def check_sequences(self, field: str, lengths: list[int]) -> None:
        """Count, per-text and total token checks of id sequences, in that order."""
        self.check_count(field, len(lengths))
        for index, length in enumerate(lengths):
            self.check_text_tokens(field, index, length)
        self.check_tokens(field, sum(lengths))

    def check_messages(self, field: str, count: int) -> None:
        """Refuse a conversation of more than ``max_messages_per_conversation`` messages."""
        if count > self.max_messages_per_conversation:
            raise LimitExceeded(
                f"{field} has {count} messages; at most {self.max_messages_per_conversation} are "
                "allowed per conversation (max_messages_per_conversation): shorten the "
                "conversation",
                field=field,
                limit=self.max_messages_per_conversation,
            )
