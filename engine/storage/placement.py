"""Where a prepare captures state: the checkpoints a target's decode leaves (`plan_saves`) and
those inside its long messages (`plan_inner`). Functions of the target's decode schedule
(`engine.core.schedule`) and its node ends alone, never of what the store already holds, so
every mode places them alike; `engine.storage.checkpoints` keeps what they capture."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from engine.core.memory import MemoryKind
from engine.core.schedule import Schedule, crossing

RECURRENT_INTERVAL = 256


def plan_saves(
    kind: MemoryKind, schedule: Schedule, node_ends: Sequence[int], interval: int, *,
    prompt_covers_last: bool = False,
) -> list[int]:
    """Where to capture state while decoding a target by `schedule`: always chunk ends.

    - The end of the prompt, always: a reply's tokens come from one-token decodes that a
      batched decode would not reproduce, so the last exact state before a reply is the
      prompt's end. The next message restores it and decodes the reply with itself.
    - Node ends (where edits diverge), for kinds whose cache cannot be cut back there:
      recurrent, hybrid and sliding-window models. A dense cache is cut back to any
      node end of the live branch for free, so it only needs the prompt-end states to jump
      to a branch that is not live. Not the last node's end when the generation prompt
      follows it and every reply to it starts with that prompt (`prompt_covers_last`,
      PromptBuilder.replies_keep_opening): the prompt-end state, a few tokens on, serves
      every path that state would, and the capture it spares comes before the first token.
    - Inside long stretches, the first chunk end at or past each multiple of `interval`. A
      recurrent state is the same size wherever it is taken (a few MiB, against a KV cache
      that grows with every token), so there the interval is at most RECURRENT_INTERVAL:
      an edit near the end of a long message then re-reads a few hundred tokens, not all.
    The answer depends on the schedule (and the template's `prompt_covers_last`) alone,
    never on what the store already holds.
    """
    if kind is MemoryKind.RECURRENT and interval > 0:
        interval = min(interval, RECURRENT_INTERVAL)
    ends = set(schedule.ends)
    saves = {schedule.length}
    if kind is not MemoryKind.DENSE:
        saves.update(n for n in node_ends if n in ends)
    saves.update(crossing(schedule, 0, interval))
    if prompt_covers_last and node_ends and node_ends[-1] < schedule.length:
        saves.discard(node_ends[-1])
    return sorted(saves)


# Inside a long message: a message of at least LONG_MESSAGE tokens (and two grid steps) gets
# checkpoints on the grid, at most INNER_MOST of them (a longer message gets them every few
# grid steps). A chat turn of a few hundred tokens gets none, on every kind that cannot cut
# back, and so no grid points either (engine.core.schedule, `long_run`): where a capture is
# the whole state it costs the most (on the sliding-window model each one settles the cache;
# a whole hybrid state at 8k tokens of context is 33 MB, 22-100 ms), and even where it is
# nearly free (a hybrid's partial state, 0.3 MB in 0.1 ms) the chunks are not: on the hybrid
# bench model at 8k tokens a 266-token turn decoded in five grid chunks took 788 ms, in one
# 736 ms, which put a new turn behind llama-server's (one batch). An edit inside such a
# message restarts at its start, as llama-server's does.
LONG_MESSAGE = 512
INNER_MOST = 16


def inner_span(grid: int) -> int:
    """The shortest message that gets inner checkpoints (`plan_inner`): also the shortest
    stretch the decode schedule puts grid points in, where the cache cannot be cut back
    (engine.core.schedule, `long_run`)."""
    return max(LONG_MESSAGE, 2 * grid)


def plan_inner(
    kind: MemoryKind,
    schedule: Schedule,
    marks: Sequence[int],
    grid: int,
    *,
    most: int = INNER_MOST,
) -> list[int]:
    """Inner checkpoints: grid points inside long messages, for the kinds that cannot cut
    their cache back (recurrent, hybrid, sliding window).

    An edit in the middle of a long message shares every token before the change. A dense
    cache is cut back to the grid point before it; the other kinds can only restore a saved
    state, and without one inside the message they restart at its start. With these an edit
    decodes at most a step plus the rest of the message. The step is the grid, or a
    multiple of it so that one message gets at most `most` (the caller sizes `most` by the
    memory it may use); a message shorter than LONG_MESSAGE tokens (or two grid steps) gets
    none, so a normal message costs no capture and no chunk more. A message is measured
    between the schedule's `marks`, as the schedule measures the stretches it puts grid
    points in (a message and the generation prompt after it are one stretch where they are
    one chunk), so every grid point in a long stretch can hold one. Like `plan_saves`, the
    answer depends on the schedule (and `most`) alone; the store keeps these in the room
    the other checkpoints leave and evicts them first (`CheckpointStore.add`).
    """
    if kind is MemoryKind.DENSE or grid < 1 or most < 1:
        return []
    ends = set(schedule.ends)
    bounds = sorted({0, *(n for n in marks if 0 < n < schedule.length), schedule.length})
    out: list[int] = []
    for start, stop in itertools.pairwise(bounds):
        span = stop - start
        if span < inner_span(grid):
            continue
        step = grid * max(1, -(-span // (grid * most)))
        first = (start // step + 1) * step
        out.extend(p for p in range(first, stop, step) if p in ends)
    return out
