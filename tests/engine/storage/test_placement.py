"""Where a prepare captures state (engine.storage.placement): message ends, intervals and the
grid inside long messages, per memory kind."""

from __future__ import annotations

import itertools

import pytest

from engine.core.memory import MemoryKind
from engine.core.schedule import decode_schedule
from engine.storage.placement import INNER_MOST, LONG_MESSAGE, inner_span, plan_inner, plan_saves
from tests.conftest import ALL_KINDS


def test_interval_checkpoints_sit_at_the_first_chunk_end_past_each_multiple() -> None:
    """Where they go depends on the schedule alone: no gate state, no +1 fudge (the PR's
    regression opened the gate one position early)."""
    long = decode_schedule(8494, n_batch=512)
    assert plan_saves(MemoryKind.DENSE, long, [], 2048) == [2048, 4096, 6144, 8192, 8494]
    short = decode_schedule(2047, n_batch=512)
    assert plan_saves(MemoryKind.DENSE, short, [], 2048) == [2047]
    exact = decode_schedule(2048, n_batch=512)
    assert plan_saves(MemoryKind.DENSE, exact, [], 2048) == [2048]
    assert plan_saves(MemoryKind.DENSE, long, [], 0) == [8494]
    # A message end just before a multiple: the first chunk end at or past it takes it.
    marked = decode_schedule(3000, n_batch=512, marks=[2040])
    assert 2048 in marked.ends and plan_saves(MemoryKind.DENSE, marked, [2040], 2048) == [
        2048, 3000,
    ]


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_placement_policy_per_memory_kind(kind: MemoryKind) -> None:
    node_ends = [20, 60, 100, 140]  # system, user, assistant, user
    schedule = decode_schedule(143, n_batch=512, marks=node_ends)
    saves = plan_saves(kind, schedule, node_ends, interval=64)
    if kind is MemoryKind.DENSE:
        # The live cache cuts back to any node end for free: only the prompt's end (to jump
        # to a branch that is not live) and the interval's chunk ends.
        assert saves == [100, 140, 143]
    else:
        # Recurrent, hybrid and sliding-window caches cannot go back: keep every node end.
        assert saves == [20, 60, 100, 140, 143]
    assert set(saves) <= set(schedule.ends)  # checkpoints are taken only at chunk ends


def test_a_recurrent_state_is_saved_more_often_inside_long_messages() -> None:
    """Its size does not grow with the position, so its grid and interval are capped; the
    other kinds keep the user's interval (their state grows with every token)."""
    node_ends = [20, 1020, 1530]  # system, a 1,000-token user message, its reply
    recurrent = decode_schedule(1535, n_batch=512, grid=256, marks=node_ends)
    assert plan_saves(MemoryKind.RECURRENT, recurrent, node_ends, 2048) == [
        20, 256, 512, 768, 1020, 1024, 1280, 1530, 1535,
    ]
    hybrid = decode_schedule(1535, n_batch=512, marks=node_ends)
    assert plan_saves(MemoryKind.HYBRID, hybrid, node_ends, 2048) == [20, 1020, 1530, 1535]
    assert plan_saves(MemoryKind.RECURRENT, recurrent, node_ends, 0) == [20, 1020, 1530, 1535]



@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_inner_checkpoints_sit_on_the_grid_inside_long_messages(kind: MemoryKind) -> None:
    """Where an edit inside a long message restarts: every grid point inside it, for the
    kinds that cannot cut back; a dense cache is cut back there for free."""
    # system, a short user message, a long one, its reply, a 300-token turn, its reply
    node_ends = [20, 100, 700, 720, 1020, 1040]
    schedule = decode_schedule(1045, n_batch=512, grid=64, marks=node_ends)
    inner = plan_inner(kind, schedule, node_ends, 64)
    if kind is MemoryKind.DENSE:
        assert inner == []
    else:
        # None in the 80-token message, in the 300-token turn (shorter than LONG_MESSAGE),
        # nor in the replies.
        assert LONG_MESSAGE == 512
        assert inner == [128, 192, 256, 320, 384, 448, 512, 576, 640]
        assert set(inner) <= set(schedule.ends)


def test_the_grid_splits_only_stretches_of_at_least_long_run_tokens() -> None:
    """A cache that cannot be cut back gets grid points only where inner checkpoints can
    go: a 270-token turn on a recurrent model is three chunks, not seven, and a long
    message keeps every grid point (the ones `plan_inner` takes)."""
    marks = [3, 264]  # a reply's end, a 261-token user message, then the generation prompt
    everywhere = decode_schedule(270, n_batch=512, grid=64, marks=marks)
    assert everywhere.ends == (3, 64, 128, 192, 256, 264, 270)
    assert decode_schedule(270, n_batch=512, grid=64, marks=marks, long_run=0) == everywhere
    short = decode_schedule(270, n_batch=512, grid=64, marks=marks, long_run=512)
    assert short.ends == (3, 264, 270)
    assert inner_span(64) == 512  # on every kind that cannot cut back
    node_ends = [20, 100, 700, 720, 1020, 1040]  # as in the test above
    schedule = decode_schedule(1045, n_batch=512, grid=64, marks=node_ends,
                               long_run=inner_span(64))
    assert schedule.ends == (20, 100, *range(128, 700, 64), 700, 720, 1020, 1040, 1045)
    assert plan_inner(MemoryKind.RECURRENT, schedule, node_ends, 64) == [*range(128, 700, 64)]
    # A stretch longer than a batch is still cut every n_batch from its start.
    assert decode_schedule(700, n_batch=256, grid=64, marks=[10, 400],
                           long_run=512).ends == (10, 266, 400, 656, 700)


def test_inner_checkpoints_measure_a_message_as_the_schedule_does() -> None:
    """A 508-token message and the 5-token generation prompt after it are one chunk, one
    stretch of 513 tokens between two marks: the schedule puts grid points in it, and each
    of them gets an inner checkpoint (measured by the message's own end, none would)."""
    marks = [20, 533]  # the system message's end; the prompt's end (the message's is none)
    schedule = decode_schedule(533, n_batch=512, grid=64, marks=marks,
                               long_run=inner_span(64))
    grid = [*range(64, 533, 64)]
    assert schedule.ends == (20, *grid, 533)
    assert plan_inner(MemoryKind.RECURRENT, schedule, marks, 64) == grid
    assert plan_inner(MemoryKind.RECURRENT, schedule, [20, 528], 64) == []  # by node ends


def test_a_very_long_message_gets_a_bounded_number_of_inner_checkpoints() -> None:
    """The step grows by whole grid steps: a message of L tokens gets at most `most`."""
    node_ends = [10, 4010]
    schedule = decode_schedule(4015, n_batch=512, grid=64, marks=node_ends)
    inner = plan_inner(MemoryKind.HYBRID, schedule, node_ends, 64)
    assert len(inner) == 15 <= INNER_MOST
    assert {b - a for a, b in itertools.pairwise(inner)} == {256}  # 4 grid steps
    assert inner[0] == 256 and inner[-1] == 3840
    few = plan_inner(MemoryKind.RECURRENT, schedule, node_ends, 64, most=3)
    assert few == [1344, 2688]  # 3 x 1,344 >= 4,000: a step of 21 grid steps
    assert plan_inner(MemoryKind.RECURRENT, schedule, node_ends, 64, most=0) == []
    # The prompt's tail after the last node is a stretch too (a long continued reply).
    assert plan_inner(MemoryKind.SLIDING_WINDOW, schedule, [10], 64)[-1] == 3840


# --- search and restore on every memory kind -------------------------------------------------
