"""The pieces of texts already encoded, and their ids: a prefix tree bounded by a byte budget.

A node is keyed by its parent's serial and its piece's text, so a node stands for the whole text
from the start up to the end of its piece: reusing a chain of nodes reuses exactly that prefix
(the dictionary compares the piece texts themselves; no digest can collide). Least recently used
nodes go first when the budget is exceeded; a chain is touched from its leaf to its root, so a
root outlives the leaves that hang from it. A node whose parent was evicted is never reached
again and ages out. Safe to share between threads.
"""

from __future__ import annotations

import itertools
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

#: Bytes a node costs besides its text and ids: the key tuple, the node, the dict entry.
_NODE_OVERHEAD = 240
_ROOT = 0


@dataclass(slots=True)
class Node:
    """One cached piece: the ids it encodes to (without special tokens)."""

    key: tuple[int, str]
    serial: int
    ids: array
    nbytes: int


class SegmentCache:
    """Ids of text prefixes, piece by piece, within ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._nodes: OrderedDict[tuple[int, str], Node] = OrderedDict()
        self._serials = itertools.count(1)
        self._lock = threading.Lock()
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._nodes)

    def lookup(self, pieces: Sequence[str]) -> list[Node]:
        """The cached nodes of the longest run of ``pieces`` from the first; touches them."""
        chain: list[Node] = []
        with self._lock:
            parent = _ROOT
            for piece in pieces:
                node = self._nodes.get((parent, piece))
                if node is None:
                    break
                chain.append(node)
                parent = node.serial
            self._touch(chain)
        return chain

    def store(self, chain: Sequence[Node], pieces: Sequence[str], ids: Sequence[list[int]]) -> None:
        """Add ``pieces`` (encoded to ``ids``) after ``chain``, then evict down to the budget."""
        added: list[Node] = []
        with self._lock:
            parent = chain[-1].serial if chain else _ROOT
            for piece, piece_ids in zip(pieces, ids, strict=True):
                key = (parent, piece)
                node = self._nodes.get(key)
                if node is None:
                    packed = array("I", piece_ids)
                    size = sys.getsizeof(piece) + sys.getsizeof(packed) + _NODE_OVERHEAD
                    if size > self.max_bytes:
                        break
                    node = Node(key, next(self._serials), packed, size)
                    self._nodes[key] = node
                    self.bytes += size
                added.append(node)
                parent = node.serial
            self._touch([*chain, *added])
            while self.bytes > self.max_bytes and self._nodes:
                _, evicted = self._nodes.popitem(last=False)
                self.bytes -= evicted.nbytes
                self.evictions += 1

    def clear(self) -> None:
        """Drop every node."""
        with self._lock:
            self._nodes.clear()
            self.bytes = 0

    def _touch(self, chain: Sequence[Node]) -> None:
        # Leaf first, root last: the root ends most recent, so eviction takes leaves first.
        for node in reversed(chain):
            if node.key in self._nodes:
                self._nodes.move_to_end(node.key)
