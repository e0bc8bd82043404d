"""Checkpoints: saved per-sequence engine state after a known prefix of tokens.

A checkpoint holds the exact tokens its state covers, so it is valid for a target exactly
when those tokens are a prefix of the target. It is attached to the tree node whose tokens end
it (or contain its end), so it dies with that node.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

_ids = itertools.count(1)


@dataclass(frozen=True, eq=False)
class Checkpoint:
    tokens: tuple[int, ...]  # the prefix the state covers: positions 0..len-1
    blob: bytes  # llama_state_seq_get_data_ext output
    flags: int = 0
    node_id: int | None = None
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def pos_max(self) -> int:
        return len(self.tokens) - 1

    @property
    def size(self) -> int:
        return len(self.blob)

    def is_prefix_of(self, target: tuple[int, ...] | list[int]) -> bool:
        n = len(self.tokens)
        return n <= len(target) and tuple(target[:n]) == self.tokens
