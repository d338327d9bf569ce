"""A prompt's token ids checked once, as the compact array the key function and sampler read."""

from __future__ import annotations

import contextlib
from array import array

from tokenkeys.errors import InvalidArgument

_U32 = 1 << 32


def checked_ids(prompt: list[int]) -> array:
    """The prompt as ``array('I')``, or InvalidArgument naming the first bad id.

    The common case runs at C speed (one type per id, then the array's own range check); only
    a prompt that fails it is walked in Python, for the error's index.
    """
    if set(map(type, prompt)) <= {int}:
        with contextlib.suppress(OverflowError):
            return array("I", prompt)
    for i, t in enumerate(prompt):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < _U32:
            raise InvalidArgument(
                f"prompt_token_ids[{i}] is {t!r}; token ids are integers in [0, 2**32)",
                field="prompt_token_ids",
            )
    return array("I", prompt)  # int subclasses other than bool, all in range
