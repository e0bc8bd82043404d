"""Summaries of repeated, interleaved measures: medians, spreads and same-round ratios.

The machine is shared, so a figure alone says little: each system is also reported as a
ratio to the full reprocess measured in the same round (same length, same repetition), and
the ratios are summarised like the times.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values to summarise")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def describe(self, unit: str = "", digits: int = 2) -> str:
        """'1.23 s (1.10-1.40)', the range only when there is one."""
        text = f"{self.median:.{digits}f}{unit}"
        if self.n > 1 and self.high > self.low:
            text += f" ({self.low:.{digits}f}-{self.high:.{digits}f})"
        return text


def ratios(values: Sequence[float], references: Sequence[float]) -> list[float]:
    """Each value over the reference of its own round (rounds line up by index)."""
    if len(values) != len(references):
        raise ValueError("a ratio needs one reference per round")
    return [v / max(r, 1e-9) for v, r in zip(values, references, strict=True)]


def speedups(slow: Sequence[float], fast: Sequence[float]) -> list[float]:
    """How many times faster `fast` was than `slow`, round by round."""
    return ratios(slow, fast)
