"""The length of the common prefix of two sequences, compared a block at a time.

Every request compares its prompt with what came before (the rendered text, the live cache's
tokens): tens of thousands of items in a long conversation. Compared one item at a time in
Python that is milliseconds per call, growing with the conversation; slices of a block
compare in C, so only the block where they differ is walked item by item.

Where one target is tested against many saved prefixes (every checkpoint of a long
conversation), both are `packed`: then a prefix test is one `bytes.startswith`, a memcmp.
Tuples of ints are no substitute: `==` on two tuples walks their common items one by one
before it looks at their lengths, so a test against each of a few hundred checkpoints on the
same branch walked the whole conversation each time.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TypeVar

BLOCK = 512
T = TypeVar("T")
TOKEN_BYTES = 4  # a packed token id: a C int (llama_token is int32_t)


def packed(tokens: Sequence[int]) -> bytes:
    """Token ids as bytes, TOKEN_BYTES to an id, in the machine's order: packed runs
    compare (`==`, `startswith`) in C."""
    return array("i", tokens).tobytes()


def common_prefix(a: Sequence[T], b: Sequence[T]) -> int:
    """How many leading items `a` and `b` share. A list and a tuple compare by items."""
    n = min(len(a), len(b))
    same_type = type(a) is type(b)
    i = 0
    while i < n:
        j = min(n, i + BLOCK)
        left, right = a[i:j], b[i:j]
        if (left == right) if same_type else (list(left) == list(right)):
            i = j
            continue
        break
    while i < n and a[i] == b[i]:
        i += 1
    return i
