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
