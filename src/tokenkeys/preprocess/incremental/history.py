"""Templates that rewrite history: turn N's prompt no extension of turn N-1's.

A conversation resent with one more exchange should render to the earlier prompt plus the new
turns; engine prefix caches (and this service's piece cache) depend on it. Some templates
rewrite what they rendered before (dropping earlier reasoning blocks, or a generation prompt
that the rendered assistant turn does not repeat), so nothing after the change can be reused.
This watch sees it where the chat path renders: a request whose messages extend an earlier
request's (same template and render inputs) must render to a prompt that starts with the
earlier one. Each miss is counted, and the first one per model is logged, so an operator learns
why hit rates are low. Only digests are kept, bounded in number.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

_DEFAULT_CONVERSATIONS = 4096


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _plain(value: Any) -> Any:
    # Frozen requests hold read-only mappings (tuples serialize as arrays already).
    return dict(value) if isinstance(value, Mapping) else str(value)


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_plain).encode()


class HistoryWatch:
    """Counts renders that are no extension of the same conversation's previous render."""

    def __init__(self, model: str = "", conversations: int = _DEFAULT_CONVERSATIONS) -> None:
        self.model = model
        self.rewrites = 0
        self._capacity = conversations
        # digest of (context, messages[:n]) -> (prompt length, digest of the prompt)
        self._seen: OrderedDict[bytes, tuple[int, bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self._logged = False

    def observe(
        self, context: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], prompt: str
    ) -> bool:
        """Record a render; True when it rewrote an earlier render of the same conversation."""
        # One running hash over the context and the messages: its state after each message
        # names the conversation up to there.
        running = hashlib.blake2b(_canonical(context), digest_size=16)
        chain = [running.digest()]
        for message in messages:
            running.update(_canonical(message))
            chain.append(running.digest())
        encoded = prompt.encode("utf-8", "surrogatepass")
        with self._lock:
            earlier = None
            for key in reversed(chain[1:-1]):
                earlier = self._seen.get(key)
                if earlier is not None:
                    break
            self._seen[chain[-1]] = (len(encoded), _digest(encoded))
            self._seen.move_to_end(chain[-1])
            while len(self._seen) > self._capacity:
                self._seen.popitem(last=False)
            if earlier is None:
                return False
            size, digest = earlier
            if size <= len(encoded) and _digest(memoryview(encoded)[:size]) == digest:
                return False
            self.rewrites += 1
            first = not self._logged
            self._logged = True
        if first:
            log.warning(
                "model %s: the chat template rewrote an earlier turn (a conversation's prompt is "
                "no extension of its previous prompt), so engine prefix caches and the tokenize "
                "cache cannot reuse it past the change; counted in "
                "tokenkeys_chat_history_rewrites_total (logged once per model)",
                self.model or "?",
            )
        return True
