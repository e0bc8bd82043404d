"""Where a path's tokens are split into decode chunks: one schedule per path, for every mode.

llama.cpp's result for a token depends on the chunk it was decoded in, not only on the tokens
before it: on Gemma 3 270M Q4_K_M, decoding 104 tokens in one chunk or split in two changed
the last logits by up to 1.35 (the CPU's K-quant kernels take a row-blocked path for part of
a chunk and a per-row path for the rest). So "a reply equals a full reprocess" can only hold
if every mode (the full reprocess, a restore and its tail, live-cache reuse, a warm-up) splits
a path at the same places. Those places are a function of the path alone:

- its marks: where each node ends, and where each reply's generation prompt ends (the prompt
  end of the turn that produced it), but for the end of the message a reply answers, where
  the two are one chunk (engine.core.prompt, `PromptBuilder.marks`);
- a grid of absolute positions every `grid` tokens (CPU_GRID or GPU_GRID, or `n_batch` if
  smaller), so long messages are split the same way whatever else is on the path, and an
  edit inside one re-decodes at most a grid step before the change. Only inside stretches
  between two marks of at least `long_run` tokens: a model whose cache cannot be cut back
  (recurrent, hybrid, sliding window) restarts an edit at a saved state, and saves none
  inside a shorter message (engine.storage.placement.plan_inner), so there the grid would
  only split the decode (on a Mamba 12x768 at 8k tokens, a 270-token turn in seven chunks
  took 730 ms, in three 700 ms); a dense cache is cut back to any chunk end, so it keeps
  the grid everywhere (`long_run` 0);
- `n_batch`: a stretch between two of those longer than a batch is cut every `n_batch`
  tokens from its start.

The construction is causal but for `long_run`: the chunk ends up to a position depend only on
the marks up to it, and on whether the stretch it is in is long. So when two paths share a
prefix and a chunk end, they were split identically up to there, and state saved there on
one is exactly the state the other would compute; an edit that makes a long message short
(or a short one long) changes that message's grid, and so restarts at its start.
Checkpoints and the live cache record the chunk ends they were decoded with
(`Schedule.ends` up to their length), and are reused only where those equal the target's:
what the cache did can never change a result, on any model, quantization or backend.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_INTERVAL = 2048  # tokens between the checkpoints a long prompt leaves

# The grid step. On the CPU, chunks of 64 tokens prefill as fast as chunks of 512 (measured
# here on 1,500 tokens: SmolLM2 7.2 s vs 7.8 s, Gemma 3 270M 2.7 s vs 2.7 s) and bound what
# an edit in the middle of a long message re-decodes before the change to 63 tokens. GPU
# kernels want bigger batches.
CPU_GRID = 64
GPU_GRID = 256


@dataclass(frozen=True)
class Schedule:
    """The chunk ends of one target, ascending; the last is the target's length."""

    ends: tuple[int, ...]

    @property
    def length(self) -> int:
        return self.ends[-1] if self.ends else 0

    def upto(self, n: int) -> tuple[int, ...]:
        """The chunk ends at or before position `n`."""
        return tuple(end for end in self.ends if end <= n)

    def agrees(self, bounds: Sequence[int]) -> bool:
        """Whether state decoded with chunk ends `bounds` is this schedule's state at
        `bounds[-1]`: the same ends, in the same places, up to there."""
        n = len(bounds)
        return 0 < n <= len(self.ends) and tuple(bounds) == self.ends[:n]

    def chunks(self, start: int) -> list[int]:
        """The chunk ends to decode from `start`, itself a chunk end (or 0)."""
        if start and start not in self.ends:
            raise ValueError(f"{start} is not a chunk end of this schedule")
        return [end for end in self.ends if end > start]


def decode_schedule(
    length: int, *, n_batch: int, grid: int | None = None, marks: Iterable[int] = (),
    long_run: int = 0,
) -> Schedule:
    """The schedule of a target of `length` tokens with the given marks (see the module):
    grid points inside the stretches between marks of at least `long_run` tokens."""
    if length < 1:
        raise ValueError("a schedule needs at least one token")
    if n_batch < 1:
        raise ValueError("n_batch must be at least 1")
    step = n_batch if grid is None else grid
    if not 0 < step <= n_batch:
        raise ValueError(f"the grid ({step}) must be between 1 and n_batch ({n_batch})")
    points = {m for m in marks if 0 < m < length}
    points.add(length)
    for start, stop in itertools.pairwise(sorted({0, *points})):
        if stop - start >= long_run:
            points.update(range((start // step + 1) * step, stop, step))
    ends: list[int] = []
    position = 0
    for point in sorted(points):
        while point - position > n_batch:
            position += n_batch
            ends.append(position)
        ends.append(point)
        position = point
    return Schedule(tuple(ends))


def crossing(schedule: Schedule, start: int, interval: int) -> list[int]:
    """Chunk ends after `start` that are the first at or past a multiple of `interval`:
    where an interval checkpoint goes (at most one per interval tokens, a function of the
    schedule alone, so every mode places them alike)."""
    if interval <= 0:
        return []
    out: list[int] = []
    previous = 0
    for end in schedule.ends:
        if end // interval > previous // interval and end > start:
            out.append(end)
        previous = end
    return out
