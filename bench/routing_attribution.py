"""Where router replicas lose cache hits against one router, turn by turn (``--replicas N``).

The concurrent workload plays the same conversations for every row (the questions are drawn
from a seeded generator, the simulated engines' replies from the prompt's ids), so each
(conversation, turn) of a replica row has its counterpart in one router's row. The cached
tokens one router got and the replicas did not are put down to one of:

- ``split``: a first turn whose system prompt another conversation's first turn put on
  another worker (replicas deciding one new prompt at the same instant parted on it: it was
  computed twice);
- ``moved``: a follow-up sent to another worker than its conversation's previous turn (its
  history is computed again there);
- ``evicted``: a follow-up on the same worker as its previous turn that found less of its
  history cached than with one router (that worker's cache held more than one router put
  there, and evicted);
- ``other``: a first turn that went with its system prompt's other conversation yet found
  less cached (the engine served the two in another order).

Negative figures are hits the replicas got and one router did not. The sum is the row's
whole difference from one router in cached tokens.
"""

from __future__ import annotations

from collections import Counter

Turns = dict[tuple[int, int], tuple[int, int, str | None]]
CAUSES = ("split", "moved", "evicted", "other")


def lost_hits(one: Turns, row: Turns, systems: int) -> dict[str, int]:
    """Cached tokens one router's row (``one``) got and ``row`` did not, by cause (module
    doc); conversation ``c`` opens with system prompt ``c % systems``. ``row`` must name the
    worker that served each turn."""
    first_workers: dict[int, set[str | None]] = {}
    for (c, turn), (_, _, by) in row.items():
        if turn == 0:
            first_workers.setdefault(c % systems, set()).add(by)
    lost: Counter[str] = Counter(dict.fromkeys(CAUSES, 0))
    for (c, turn), (_, cached, by) in row.items():
        missed = one[(c, turn)][1] - cached
        if turn == 0:
            cause = "split" if len(first_workers[c % systems]) > 1 else "other"
        else:
            cause = "moved" if row[(c, turn - 1)][2] != by else "evicted"
        lost[cause] += missed
    return dict(lost)


def fullest(row: Turns) -> int:
    """The most conversations round 0 left on one worker (one router leaves 8 on each of
    4): where they outgrow its KV cache at the last turns, their histories are evicted."""
    return max(Counter(by for (_, turn), (_, _, by) in row.items() if turn == 0).values())


def attribution(one: dict, row: dict, systems: int) -> str:
    """One line: the row's cached tokens lost against one router's, by cause, as tokens and
    as a share of one router's cached tokens (``1 - ratio`` in all), and the most
    conversations round 0 left on one worker (:func:`fullest`)."""
    if None in (by for _, _, by in row["turns"].values()):
        return "lost hits not attributed (the workers that served were not reported)"
    lost = lost_hits(one["turns"], row["turns"], systems)
    cached = sum(k for _, k, _ in one["turns"].values())
    parts = ", ".join(
        f"{cause} {lost[cause]:,} ({100 * lost[cause] / cached:.1f} %)" for cause in CAUSES
    )
    return (
        f"cached tokens lost against one router's {cached:,}: {parts}; round 0 left "
        f"{fullest(row['turns'])} conversations on the fullest worker"
    )
