"""Small helpers shared by the engine tests."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from engine.llm.runtime import Runtime


def random_tokens(n: int, seed: int = 0) -> list[int]:
    """A reproducible stream of ordinary (non-special) tokens."""
    rng = random.Random(seed)
    return [rng.randrange(200, 40000) for _ in range(n)]


def fresh_logits(
    runtime: Runtime, target: list[int], marks: Sequence[int] = ()
) -> np.ndarray:
    """The logits of `target` decoded from scratch by its schedule (the chunk ends `marks`
    give): the reference for every cached answer."""
    runtime.clear()
    report = runtime.prepare(target, marks=marks, use_live=False)
    assert report.reused_tokens == 0
    return runtime.last_logits()


class InsideSecondChunk:
    """A cancel check that lets the first chunk complete and the check before the second
    pass, then says stop from inside llama.cpp's decode of the second (its abort
    callback): pass `progress` as on_progress and the object as cancel."""

    def __init__(self) -> None:
        self.first_done = False
        self.after = 0  # calls since the first chunk completed

    def progress(self, done: int, _total: int) -> None:
        self.first_done = self.first_done or done > 0

    def __call__(self) -> bool:
        if not self.first_done:
            return False
        self.after += 1
        return self.after > 1  # the first is the check between chunks

    @property
    def aborted_inside(self) -> bool:
        """Whether the abort callback, not the check between chunks, stopped it."""
        return self.after > 1
