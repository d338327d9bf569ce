"""The walks over a router's counts of keys in flight (``index.table.held_prefix`` and
``count_absent``, which the load views call per candidate and decision): in C beside the
compiled key table, and in Python, the same answers and the same errors."""

from __future__ import annotations

from collections import Counter

import pytest
from evidence import unavailable
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys.router.index import table

keys = st.lists(st.integers(0, 40) | st.integers(0, 2**64 - 1), max_size=60)


def both(fn, *args):  # noqa: ANN001, ANN201
    """``fn``'s answer in C and in Python (hypothesis refuses monkeypatch: restored by hand)."""
    core = table.CORE
    if core is None:
        unavailable(
            f"the compiled key table is not built here ({table.describe()}): "
            "`python3 setup.py build_ext --inplace` builds it"
        )
    compiled = fn(*args)
    table.CORE = None
    try:
        return compiled, fn(*args)
    finally:
        table.CORE = core


@given(keys, keys, st.sampled_from([list, tuple]))
def test_held_prefix_is_the_python_walk(prompt, held, kind):
    counts = Counter(held)
    # A prompt starting with held keys as well as one starting anywhere.
    for candidate in (kind(prompt), kind(held[: len(held) // 2] + prompt)):
        compiled, python = both(table.held_prefix, candidate, counts)
        assert compiled == python
        assert type(compiled) is int


@given(keys, keys, st.sampled_from([frozenset, set]))
def test_count_absent_is_the_python_walk(prefilling, prompt, kind):
    compiled, python = both(table.count_absent, Counter(prefilling), kind(prompt))
    assert compiled == python and type(compiled) is int


def test_the_same_errors():
    with pytest.raises(TypeError):
        both(table.held_prefix, [1, [2]], Counter([1]))
    with pytest.raises(TypeError):
        both(table.held_prefix, 5, Counter([1]))
    assert both(table.count_absent, Counter([1, 2]), frozenset()) == (2, 2)
