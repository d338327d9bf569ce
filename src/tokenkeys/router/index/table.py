"""The in-memory index's key table (u64 key -> holder set, in recency order), and the switch to C.

:class:`MemoryPrefixIndex <tokenkeys.router.index.memory.MemoryPrefixIndex>` keeps its keys in
one table with the methods of :class:`PyKeyTable`. Where the optional C extension
``tokenkeys.router.index._table`` is built (``setup.py``), :func:`new_table` returns its
``KeyTable``: an open-addressing array of 24-byte slots with the recency list linked through
slot numbers (no Python int, dict entry or list node per key), not tracked by the cycle
collector, its bulk methods probing keys in prefetched batches (``_native/``: the slot array
in ``slots.c``, the bulk methods in ``bulk.c``, the type in ``table.c``). Without
it, or with ``TOKENKEYS_NATIVE=0`` (the switch the compiled key core reads too), the index runs
on :class:`PyKeyTable`, an ``OrderedDict``: the same methods, the same answers (the tests run
the index's suites and a property test through both). The module's :func:`held_prefix` and
:func:`count_absent` walk a prompt's keys against a router's counts of keys in flight
(``router.workers.load_view``), in C beside the table where it is built.
"""

from __future__ import annotations

import os
from array import array
from collections import OrderedDict, deque
from collections.abc import Container, Mapping, Sequence
from itertools import groupby, islice
from types import ModuleType
from typing import Any

from tokenkeys.errors import InvalidArgument
from tokenkeys.keys.native import ENV, load_core
from tokenkeys.router.index.model import check_keys

# Keys runs() reads from the table first; each further chunk doubles (it stops at a miss).
_FIRST_CHUNK = 16


class PyKeyTable(OrderedDict):
    """The pure-Python key table: an ``OrderedDict`` (oldest first) and the bulk methods."""

    _found: Sequence[int] = ()  # the held prefix of the last runs()

    def reserve(self, n: int) -> None:
        """Nothing: a dict grows by itself (the C table grows to room for ``n`` at once)."""

    def pop_oldest(self) -> tuple[int, Any]:
        """Remove and return the least recently used ``(key, holders)``."""
        return self.popitem(last=False)

    def touch(self, keys: Sequence[int]) -> None:
        """Make each key (all present) the newest, in order."""
        deque(map(self.move_to_end, keys), maxlen=0)  # the loop runs in C

    def runs(self, keys: Sequence[int]) -> list[tuple[Any, int]] | None:
        """``(holders, count)`` per run of one holder object over the held prefix of ``keys``
        (up to the first key not in the table); ``None`` when a key is not an exact int in
        [0, 2**64) (:func:`check_keys` then names it). The held prefix is kept for
        :meth:`touch_found`.

        Read in chunks that double from :data:`_FIRST_CHUNK` (each chunk in C), so a prompt
        held only at its start, or not at all, costs few reads past its held part.
        """
        try:
            check_keys(keys)
        except InvalidArgument:
            return None
        get, rest, rows, size = self.get, iter(keys), [], _FIRST_CHUNK
        while part := list(map(get, islice(rest, size))):
            if not all(part):  # holder sets are always true; None is a key nobody holds
                rows += islice(part, part.index(None))
                break
            rows += part
            size *= 2
        self._found = keys[: len(rows)]
        # groupby compares identities in C (holder sets are shared, never equal but distinct).
        return [(holders, len(list(group))) for holders, group in groupby(rows)]

    def touch_found(self, n: int) -> None:
        """Make the first ``n`` keys the last :meth:`runs` found the newest, in order."""
        self.touch(self._found[:n])

    def add_keys(
        self, keys: Sequence[int], value: Any, capacity: int, log: array | None = None
    ) -> tuple[list[int], list[tuple[int, Any]]] | None:
        """In order: insert each absent key with ``value`` as the newest, evicting the oldest
        past ``capacity``; make each present key the newest and list it. Returns the present
        keys and the evicted ``(key, holders)``, in order, and appends the keys to ``log`` (an
        ``array('Q')``); ``None``, with nothing changed, when a key is not an exact int in
        [0, 2**64) (:func:`check_keys` then names it)."""
        try:
            check_keys(keys)
        except InvalidArgument:
            return None
        if log is not None:
            log.extend(keys)
        present: list[int] = []
        evicted: list[tuple[int, Any]] = []
        if len(self) + len(keys) <= capacity:  # nothing can be evicted: the common case
            get = self.get
            for key in keys:
                if get(key) is None:
                    self[key] = value
                else:
                    self.move_to_end(key)
                    present.append(key)
            return present, evicted
        for key in keys:
            if self.get(key) is None:
                self[key] = value
                if len(self) > capacity:
                    evicted.append(self.popitem(last=False))
            else:
                self.move_to_end(key)
                present.append(key)
        return present, evicted


#: The extension module, or ``None`` (not built, or switched off). Tests replace it to run the
#: pure-Python table in the same process.
CORE: ModuleType | None = load_core("tokenkeys.router.index._table")


def new_table() -> Any:
    """An empty key table: the C ``KeyTable`` where built, else a :class:`PyKeyTable`."""
    core = CORE
    return PyKeyTable() if core is None else core.KeyTable()


def held_prefix(keys: Sequence[int], counts: Container[int]) -> int:
    """How many leading ``keys`` are in ``counts`` (a router's keys in flight at a worker):
    one membership test per key up to the first one missing, in C where the table is built
    (the same tests in the same order, so the same answer or exception)."""
    core = CORE
    if core is not None:
        return core.held_prefix(keys, counts)
    n = 0
    for key in keys:
        if key not in counts:
            break
        n += 1
    return n


def count_absent(counts: Mapping[int, int], keys: Container[int]) -> int:
    """How many keys of the dict ``counts`` are not in ``keys``, in C where the table is
    built (as :func:`held_prefix`)."""
    core = CORE
    if core is not None and isinstance(counts, dict):
        return core.count_absent(counts, keys)
    return sum(1 for key in counts if key not in keys)


def describe() -> str:
    """One line for logs and benchmarks: which key table the in-memory index runs on."""
    if CORE is None:
        return "pure Python" + (f" ({ENV}=0)" if os.environ.get(ENV) == "0" else "")
    return f"C ({CORE.slot_size()}-byte slots)"
