"""Configurable request limits, checked at the one place every path passes through."""

from __future__ import annotations

from dataclasses import dataclass

from tokenkeys.errors import LimitExceeded


@dataclass(frozen=True)
class Limits:
    """Upper bounds on what one request may ask for; each is a server option.

    - ``max_request_bytes``: size of one gRPC message or HTTP body.
    - ``max_texts_per_request``: texts in one Tokenize call, sequences in one Detokenize call.
    - ``max_chars_per_text``: characters of one text (checked before encoding, so a huge text
      costs nothing).
    - ``max_tokens_per_request``: ids produced or submitted by one request, all texts together.
    """

    max_request_bytes: int = 16 * 1024 * 1024
    max_texts_per_request: int = 1024
    max_chars_per_text: int = 4 * 1024 * 1024
    max_tokens_per_request: int = 1_048_576

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

    def check_tokens(self, field: str, total: int) -> None:
        """Refuse a request whose ids add up to more than ``max_tokens_per_request``."""
        if total > self.max_tokens_per_request:
            raise LimitExceeded(
                f"{field} amounts to {total} tokens; at most {self.max_tokens_per_request} are "
                "allowed per request (max_tokens_per_request)",
                field=field,
                limit=self.max_tokens_per_request,
            )
