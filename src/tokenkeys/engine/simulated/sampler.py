"""Deterministic output tokens for the simulated engine."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from tokenkeys.errors import ConfigError
from tokenkeys.keys.profile import check_tokens, le_bytes


class TokenSampler:
    """Draw output tokens from ``vocab`` with a generator seeded by (seed, prompt).

    The same prompt and seed always give the same tokens, on every host and Python version
    (``random.Random`` seeded with an int is stable across CPython releases).
    """

    def __init__(self, vocab: Sequence[int]) -> None:
        if len(vocab) == 0:
            raise ConfigError(
                "output vocabulary is empty; give at least one token id", field="vocab"
            )
        self.vocab = tuple(vocab)

    def rng(self, prompt_token_ids: Sequence[int], seed: int | None) -> random.Random:
        """Return the generator for one request."""
        h = hashlib.sha256(f"{seed}|".encode())
        # The ids as consecutive u32 little-endian bytes, converted at C speed.
        h.update(le_bytes(check_tokens(prompt_token_ids)))
        return random.Random(int.from_bytes(h.digest()[:8], "big"))

    def next_token(self, rng: random.Random) -> int:
        """Draw one token id."""
        return self.vocab[rng.randrange(len(self.vocab))]
