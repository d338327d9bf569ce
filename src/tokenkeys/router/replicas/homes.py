"""Where prompts moved after their decision went, for their next turns.

A request moved before its first output (``router.replicas.reconcile``: a later copy of a new
prompt, or a prompt the stream's order balanced) leaves its prompt cached where its first
attempt ran too, so its conversation's next turn matches two workers alike. Every replica
records each move as the stream tells it, so every replica knows where the prompt went
(``Placements.home``, read by ``router.policy.precise.at_home``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tokenkeys.router.policy.placement import Home

#: How many moved prompts are remembered, newest kept.
CAPACITY = 100_000
#: How far before a worker's match end :meth:`Homes.find` looks for a moved prompt's end: the
#: answer its attempt may have made there (1,024 tokens in blocks of 16).
ANSWER_BLOCKS = 64


class Homes:
    """The moved prompts' homes, by model and the prompt's last block key, oldest first."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._homes: OrderedDict[tuple[str, int], Home] = OrderedDict()

    def moved(
        self, model: str, keys: Sequence[int], fresh: Sequence[int], worker: str, left: str
    ) -> None:
        """A prompt of ``keys`` goes to ``worker`` after its sender's first attempt at
        ``left``, which computed its ``fresh`` blocks (it held the others) and may keep them
        cached."""
        homes = self._homes
        homes[(model, keys[-1])] = Home(worker, left, len(keys) - len(fresh))
        homes.move_to_end((model, keys[-1]))
        if len(homes) > self.capacity:
            homes.popitem(last=False)

    def find(self, model: str, keys: Sequence[int], blocks: int) -> Home | None:
        """Where the longest moved prompt that ends among the first ``blocks`` of ``keys``,
        at most :data:`ANSWER_BLOCKS` before the last of them, went (None: none was moved).
        A worker's match of a next turn ends where the moved prompt ended or, where the
        attempt answered, after its answer: a whole answer is moved until it arrives, so
        both workers may have made it, the same one when the answer is deterministic."""
        homes = self._homes
        for end in range(min(blocks, len(keys)), max(blocks - ANSWER_BLOCKS, 0), -1):
            home = homes.get((model, keys[end - 1]))
            if home is not None:
                return home
        return None

    def clear(self) -> None:
        """Forget every move."""
        self._homes.clear()
