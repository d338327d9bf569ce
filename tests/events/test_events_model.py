"""Event values are frozen, hashable and normalised to tuples."""

from __future__ import annotations

import dataclasses

import pytest

from tokenkeys.events.model import BlockRemoved, BlockStored, EventBatch


def test_sequences_become_tuples_and_events_are_hashable():
    event = BlockStored(
        [1, 2],
        None,
        [5, 6],
        1,
        extra_keys=[["a", ["mm", 3]], None],
        lookahead_token_ids=[[1], [2, 3]],
    )
    assert event.block_hashes == (1, 2) and event.token_ids == (5, 6)
    assert event.extra_keys == (("a", ("mm", 3)), None)
    assert event.lookahead_token_ids == ((1,), (2, 3))
    batch = EventBatch(1.0, [event, BlockRemoved([1])])
    assert isinstance(batch.events, tuple)
    assert (
        len(
            {
                event,
                BlockStored(
                    (1, 2),
                    None,
                    (5, 6),
                    1,
                    extra_keys=(("a", ("mm", 3)), None),
                    lookahead_token_ids=((1,), (2, 3)),
                ),
            }
        )
        == 1
    )
    hash(batch)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.block_size = 2  # type: ignore[misc]
