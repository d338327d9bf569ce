"""The Redis stream router replicas share their load through, and the one script it needs.

Every change a replica tells the others (a placement, a request's first output or end, a
sign of life) is one entry of the namespace's stream (``XADD``, fields ``r``: the replica,
``p``: ``1`` when the batch places a request, else ``0``, ``d``: its msgpack batch), so all
replicas read one order of changes. Each keeps a cursor,
the last entry it applied, advanced by whichever reader gets an entry first: its follower
(``XREAD BLOCK``) or a placement's reply. :data:`PLACE` is that placement: atomically it
reads the entries after the caller's cursor and, unless one of them is a peer's placement
(or the caller insists), appends the caller's placement. (A peer's first outputs, ends and
heartbeats change loads too, but they come continuously and do not make two decisions go
the same way; deciding again on each of them would only serialize the replicas longer.) So
two replicas never both record a decision made without the other's placement. The stream is
capped (``MAXLEN ~``): a replica keeps up with it, or it loses the stream and starts again
from the newest entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from tokenkeys.router.index.redis_store import Script

#: Kinds of change in an entry's batch: ``[PLACED, serial, model, address, keys, fresh,
#: growth]``, ``[ANSWERED, serial]``, ``[FINISHED, serial]``, ``[GREW, 0, model, address,
#: growth]`` (a decision not placed: local-only), ``[ALIVE, 0]`` (a sign of life).
PLACED, ANSWERED, FINISHED, GREW, ALIVE = range(5)

#: Entries the stream keeps (about; Redis trims whole nodes): seconds of a busy pool, which
#: its replicas read as they come. An entry carries its prompt's block keys (9 B each).
MAXLEN = 10_000
#: Entries one read or placement hands back at most.
READ_LIMIT = 1_000

#: KEYS: the stream. ARGV: the caller's cursor, its replica id, its entry's batch, 1 to
#: append whatever was read, MAXLEN, READ_LIMIT. Returns {id appended or "", entries read}.
PLACE = Script(
    """
local news = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', tonumber(ARGV[6]))
if ARGV[4] ~= '1' then
  for _, entry in ipairs(news) do
    local fields = entry[2]
    for i = 1, #fields, 2 do
      if fields[i] == 'r' and fields[i + 1] ~= ARGV[2] and fields[i + 3] == '1' then
        return {'', news}
      end
    end
  end
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*', 'r', ARGV[2], 'p', '1',
  'd', ARGV[3])
return {id, news}
"""
)


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
    fields a flat list (a script's reply) or a mapping (redis-py's parsed ``XREAD``)."""
    for raw_id, fields in raw:
        if not isinstance(fields, Mapping):
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        yield entry_id(raw_id), fields[b"r"], fields[b"d"]


class Cursor:
    """The last entry of the stream applied here: every entry after it is applied once, by
    whichever reader (the follower, a placement's reply) hands it over first."""

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

    def after(self, raw: Iterable[Sequence[Any]]) -> Iterator[tuple[bytes, bytes]]:
        """(replica, batch) of the entries of ``raw`` after the cursor, which follows them."""
        self.read = 0
        for at, replica, data in entries(raw):
            self.read += 1
            if at > self._at:
                self.id, self._at = f"{at[0]}-{at[1]}", at
                yield replica, data
