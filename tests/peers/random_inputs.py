"""Random request inputs for the peer comparisons: token ids, names, salts, multimodal spans.

Seeded, so a failure names a seed that reproduces it: ``TOKENKEYS_PEERS_SEED=<n>`` replays
one run. Token ids cover the whole u32 range, lengths fall on and around block boundaries, and
text fields mix ASCII with multi-byte UTF-8.
"""

from __future__ import annotations

import os
import random

from tokenkeys.keys import MMItem
from tokenkeys.keys.context import CACHE_SALT_FORBIDDEN

DEFAULT_SEED = 20261130
_TEXT = "abcXYZ019 _-.:é漢🙂"
_HEX = "0123456789abcdefABCDEF"


def seed() -> int:
    """The run's seed: ``$TOKENKEYS_PEERS_SEED`` or a fixed default (reproducible CI)."""
    return int(os.environ.get("TOKENKEYS_PEERS_SEED", DEFAULT_SEED))


def token_ids(rng: random.Random, n: int) -> list[int]:
    """``n`` ids: mostly vocabulary-sized, some anywhere in u32 (the hash input is u32-LE)."""
    return [
        rng.randrange(1 << 32) if rng.random() < 0.2 else rng.randrange(200_000) for _ in range(n)
    ]


def length(rng: random.Random, block_size: int, max_blocks: int = 6) -> int:
    """A length on a block boundary, one token short of or past one, or anywhere."""
    blocks = rng.randrange(max_blocks + 1)
    return max(0, blocks * block_size + rng.choice((0, 0, -1, 1, rng.randrange(block_size))))


def text(rng: random.Random, max_chars: int = 40) -> str:
    """A non-empty name or salt that every profile's validation accepts."""
    alphabet = "".join(c for c in _TEXT if c not in CACHE_SALT_FORBIDDEN)
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, max_chars)))


def mm_identifier(rng: random.Random) -> str:
    """A vLLM-style 64-hex processor hash (either case) or any other identifier."""
    kind = rng.randrange(3)
    if kind == 0:
        return "".join(rng.choice(_HEX) for _ in range(64))
    if kind == 1:  # 64 characters, not all hex: must not take the hex path
        return "".join(rng.choice(_HEX) for _ in range(63)) + "g"
    return text(rng)


def mm_items(rng: random.Random, n_tokens: int, max_items: int = 4) -> tuple[MMItem, ...]:
    """Sorted, non-overlapping placeholder spans inside ``[0, n_tokens)``."""
    items: list[MMItem] = []
    position = 0
    for _ in range(rng.randrange(max_items + 1)):
        if position >= n_tokens:
            break
        start = rng.randrange(position, n_tokens)
        end = rng.randint(start + 1, min(n_tokens, start + 40))
        items.append(MMItem(mm_identifier(rng), start, end - start))
        position = end
    return tuple(items)
