"""The Redis stream router replicas share their load through.

Every change a replica tells the others (a placement, a request's first output or end, a
sign of life) goes into one entry of the namespace's stream (``XADD``, fields ``r``: the
replica, ``d``: its msgpack batch of changes), so all replicas read one order of changes. A
replica appends in batches from a background task and follows the stream with ``XREAD
BLOCK``; its :class:`Cursor` is the last entry it applied. Nothing on a decision's path
waits for the stream (``router.replicas.shared_load``). The stream is capped (``MAXLEN ~``):
a replica keeps up with it, or it loses the stream and starts again from the newest entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

#: Kinds of change in an entry's batch: ``[PLACED, serial, model, address, keys, fresh,
#: growth, seen, movable]`` (a request sent; ``seen``: the last entry its replica had applied
#: when it decided; ``movable``: 1 when its sender can move it to any worker of the pool, so
#: the stream's order may balance it, ``router.replicas.reconcile``), ``[ANSWERED, serial]``,
#: ``[FINISHED, serial]``, ``[GREW, 0, model, address, growth]`` (a decision whose request
#: never went out: its growth alone), ``[ALIVE, 0]``.
PLACED, ANSWERED, FINISHED, GREW, ALIVE = range(5)

#: Entries the stream keeps (about; Redis trims whole nodes): seconds of a busy pool, which
#: its replicas read as they come. An entry carries its prompt's block keys (9 B each).
MAXLEN = 10_000
#: Entries one read hands back at most.
READ_LIMIT = 1_000


def stream_key(namespace: str) -> str:
    """The namespace's load stream (its own hash tag: one slot of a cluster)."""
    return f"tokenkeys:{{{namespace}:load}}"


def entry_id(raw: bytes | str) -> tuple[int, int]:
    """A stream id (``ms-seq``) as a pair that orders like the stream."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def entries(raw: Iterable[Sequence[Any]]) -> Iterator[tuple[tuple[int, int], bytes, bytes]]:
    """(id, replica, batch) of each stream entry as a reply holds it: ``[id, fields]``, the
    fields a flat list (a raw reply) or a mapping (redis-py's parsed ``XREAD``)."""
    for raw_id, fields in raw:
        if not isinstance(fields, Mapping):
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        yield entry_id(raw_id), fields[b"r"], fields[b"d"]


class Cursor:
    """The last entry of the stream applied here: every entry after it is applied once."""

    def __init__(self) -> None:
        self.id = "0-0"
        self._at = (0, 0)
        #: Entries handed to the last :meth:`after` (read, new or not).
        self.read = 0

    def reset(self, newest: bytes | str | None = None) -> None:
        """Start over after ``newest`` (None: the stream's start)."""
        self.id, self._at = "0-0", (0, 0)
        if newest is not None:
            self.advance(newest)

    def advance(self, raw_id: bytes | str) -> None:
        """Entries up to ``raw_id`` count as applied."""
        text = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
        at = entry_id(text)
        if at > self._at:
            self.id, self._at = text, at

    def after(self, raw: Iterable[Sequence[Any]]) -> Iterator[tuple[tuple[int, int], bytes, bytes]]:
        """(id, replica, batch) of the entries of ``raw`` after the cursor, which follows them."""
        self.read = 0
        for at, replica, data in entries(raw):
            self.read += 1
            if at > self._at:
                self.id, self._at = f"{at[0]}-{at[1]}", at
                yield at, replica, data
