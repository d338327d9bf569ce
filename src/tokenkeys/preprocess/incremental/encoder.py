"""Encoding through the piece cache: only the pieces not seen before reach the tokenizer.

A text is cut where its tokenizer's algorithm makes the parts independent
(:meth:`tokenkeys.tokenizer.splice.SplicePlan.cuts`); the longest run of its pieces already
cached is reused, the rest is encoded in one batch and cached, and the post-processor's fixed
prefix and suffix are put around the whole when special tokens are asked for. The answer equals
a full encode by construction; the guard re-encodes 1 in ``verify_every`` spliced texts whole
and compares anyway. On any difference the cache is switched off for this tokenizer, the input
is named by its SHA-256 in the log, and that request is served the full encode.

Offsets and truncation are asked for rarely and change what an encode returns: those calls
bypass the cache (counted) and encode whole.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenkeys.errors import ConfigError
from tokenkeys.preprocess.incremental.cache import Node, SegmentCache
from tokenkeys.tokenizer import Tokenizer, Truncation
from tokenkeys.tokenizer.backends import Encoded
from tokenkeys.tokenizer.splice import SplicePlan
from tokenkeys.tokenizer.splice_audit import SpliceDecision

log = logging.getLogger(__name__)

#: The default byte budget of one model's cache: 5.2M tokens of chat pieces (about 13 bytes a
#: token: text, ids and bookkeeping), some 160 conversations of 32k tokens (docs/benchmarks.md).
DEFAULT_MAX_BYTES = 64 << 20
#: The default guard rate: 1 in this many spliced texts is re-encoded whole and compared.
DEFAULT_VERIFY_EVERY = 1000


@dataclass(frozen=True)
class IncrementalOptions:
    """The cache's settings: ``max_bytes`` 0 turns it off; ``verify_every`` 0 turns the guard
    off, 1 checks every spliced text."""

    max_bytes: int = DEFAULT_MAX_BYTES
    verify_every: int = DEFAULT_VERIFY_EVERY

    def __post_init__(self) -> None:
        if self.max_bytes < 0:
            raise ConfigError(
                f"the tokenize cache budget must be at least 0 bytes (0: off), got "
                f"{self.max_bytes}",
                field="tokenize_cache_bytes",
            )
        if self.verify_every < 0:
            raise ConfigError(
                f"the tokenize cache guard rate must be at least 0 (0: off, N: 1 in N), got "
                f"{self.verify_every}",
                field="tokenize_cache_verify_every",
            )


@dataclass
class IncrementalStats:
    """What the cache did, for metrics: texts that reused a cached prefix (hits) or none
    (misses), tokens reused, calls encoded whole and why, guard checks and failures."""

    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    bypasses: dict[str, int] = field(default_factory=dict)
    guard_checks: int = 0
    guard_failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def bypassed(self, reason: str, count: int) -> None:
        with self.lock:
            self.bypasses[reason] = self.bypasses.get(reason, 0) + count


class IncrementalEncoder:
    """:meth:`Tokenizer.encode` with the piece cache in front, for one tokenizer."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        options: IncrementalOptions | None = None,
        *,
        decision: SpliceDecision | None = None,
    ) -> None:
        """``decision``: where to cut; the tokenizer's own (:attr:`Tokenizer.splice`) unless
        given (the guard's tests give a wrong one)."""
        self.tokenizer = tokenizer
        self.options = options or IncrementalOptions()
        self.stats = IncrementalStats()
        self.cache = SegmentCache(self.options.max_bytes)
        self._spliced = itertools.count(1)
        decision = decision or tokenizer.splice
        self._plan: SplicePlan | None = decision.plan
        self.reason = decision.reason
        if self.options.max_bytes == 0:
            self._plan, self.reason = None, "off: the tokenize cache budget is 0 bytes"
        elif self._plan is None:
            log.info(
                "tokenizer %s: every text is encoded whole (no incremental tokenization): %s",
                tokenizer.fingerprint[:16],
                self.reason,
            )

    @property
    def enabled(self) -> bool:
        """Whether encodes go through the cache (False: see :attr:`reason`)."""
        return self._plan is not None

    def describe(self) -> dict[str, object]:
        """The cache's state as /tokenizer_info reports it (the gRPC answer has the same)."""
        return {
            "enabled": self.enabled,
            "reason": self.reason,
            "max_bytes": self.options.max_bytes,
            "verify_every": self.options.verify_every,
        }

    def encode(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool,
        offsets: bool = False,
        truncation: Truncation | None = None,
    ) -> list[Encoded]:
        """The ids of ``texts``, exactly as :meth:`Tokenizer.encode` gives them."""
        plan = self._plan
        if plan is None or offsets or truncation is not None:
            why = "off" if plan is None else "offsets" if offsets else "truncation"
            self.stats.bypassed(why, len(texts))
            return self.tokenizer.encode(
                texts, add_special_tokens=add_special_tokens, offsets=offsets, truncation=truncation
            )
        cut = [plan.pieces(text) for text in texts]
        chains = [self.cache.lookup(pieces) for pieces in cut]
        missing = [pieces[len(chain) :] for pieces, chain in zip(cut, chains, strict=True)]
        flat = [piece for rest in missing for piece in rest]
        encoded = iter(self.tokenizer.encode(flat, add_special_tokens=False) if flat else [])
        results = []
        for text, pieces, chain, rest in zip(texts, cut, chains, missing, strict=True):
            new = [next(encoded).ids for _ in rest]
            if rest:
                self.cache.store(chain, rest, new)
            ids = self._join(plan, chain, new, add_special_tokens)
            self._count(chain)
            if len(pieces) > 1:
                ids = self._guard(text, ids, add_special_tokens)
            results.append(Encoded(ids))
        return results

    @staticmethod
    def _join(
        plan: SplicePlan, chain: Sequence[Node], new: Sequence[list[int]], specials: bool
    ) -> list[int]:
        ids: list[int] = list(plan.prefix) if specials else []
        for node in chain:
            ids.extend(node.ids)
        for piece_ids in new:
            ids.extend(piece_ids)
        if specials:
            ids.extend(plan.suffix)
        return ids

    def _count(self, chain: Sequence[Node]) -> None:
        with self.stats.lock:
            if chain:
                self.stats.hits += 1
                self.stats.reused_tokens += sum(len(node.ids) for node in chain)
            else:
                self.stats.misses += 1

    def _guard(self, text: str, ids: list[int], add_special_tokens: bool) -> list[int]:
        every = self.options.verify_every
        if not every or next(self._spliced) % every:
            return ids
        (full,) = self.tokenizer.encode([text], add_special_tokens=add_special_tokens)
        with self.stats.lock:
            self.stats.guard_checks += 1
            if full.ids == ids:
                return ids
            self.stats.guard_failures += 1
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        self._plan = None
        self.reason = (
            f"off: the guard found the spliced ids of input sha256 {digest} differ from a full "
            "encode"
        )
        self.cache.clear()
        log.error(
            "tokenizer %s: incremental tokenization differed from a full encode for input "
            "sha256 %s (%d chars, add_special_tokens=%s); the cache is off for this tokenizer",
            self.tokenizer.fingerprint[:16],
            digest,
            len(text),
            add_special_tokens,
        )
        return full.ids
