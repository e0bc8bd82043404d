"""The block-wise common prefix gives what an item-by-item walk gives, on strings and on token
lists, whatever the block boundaries and the sequences' types."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.core import prefix
from engine.core.prefix import common_prefix


def walk(a: list[int] | str, b: list[int] | str) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


@given(st.lists(st.integers(0, 3), max_size=3000), st.lists(st.integers(0, 3), max_size=3000))
def test_token_lists_and_tuples(a: list[int], b: list[int]) -> None:
    shared = a[: len(a) // 2]
    b = shared + b  # a long common stretch, crossing block boundaries
    assert common_prefix(a, b) == walk(a, b)
    assert common_prefix(a, tuple(b)) == walk(a, b)  # a list against a tuple: by items


@given(st.integers(0, 3 * prefix.BLOCK), st.text(alphabet="ab", max_size=50))
def test_strings_differing_anywhere(cut: int, tail: str) -> None:
    base = "x" * (3 * prefix.BLOCK)
    a, b = base, base[:cut] + tail
    assert common_prefix(a, b) == walk(a, b)
    assert common_prefix(a, a) == len(a) and common_prefix("", a) == 0
