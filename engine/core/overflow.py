"""What happens when a branch outgrows the context: stop, or leave its oldest messages out.

With `Overflow.DROP_OLDEST` the model reads the system prompt and the newest messages that
fit, with room left for the reply. Which messages are left out is a function of the path
alone (its nodes' token counts, the context size and the room for the reply), so a full
reprocess of the same path reads exactly what a cached reply read: the invariant holds as
it does without dropping.

The cut moves in large steps. Its possible places are fixed from the start of the
conversation, at user messages, each at least `step` tokens after the one before; the cut is
the first place from which the rest fits. So the kept prefix, and every checkpoint of it,
stays the same for many turns, and each move frees a quarter of the context at once instead
of re-decoding everything after a cut that shifts by one message per turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

T = TypeVar("T")


class Overflow(StrEnum):
    STOP = "stop"  # say the conversation no longer fits (the default)
    DROP_OLDEST = "drop-oldest"  # leave the oldest messages after the system prompt out

    @property
    def label(self) -> str:
        return {Overflow.STOP: "Stop with a message",
                Overflow.DROP_OLDEST: "Leave the oldest messages out"}[self]


def reply_room(n_ctx: int, max_tokens: int) -> int:
    """The tokens kept free for the reply when messages are left out: the reply's length,
    at most a quarter of the context."""
    return max(1, min(max_tokens, n_ctx // 4))


@dataclass(frozen=True)
class Cut:
    """Which nodes of a path the model reads: path[0] (the system prompt) and path[start:]."""

    start: int  # 1: nothing is left out
    tokens: int  # what the model reads of the path (without the reply's prompt)

    @property
    def dropped(self) -> int:
        """How many messages are left out."""
        return self.start - 1


def cut_places(lengths: Sequence[int], user: Sequence[bool], step: int) -> list[int]:
    """Where the path may be cut: index 1 (nothing left out), then user messages each at
    least `step` tokens after the previous place. A place depends only on the nodes before
    it, so the places of a path are the places of every path it grows into."""
    places = [1]
    run = 0
    for index in range(1, len(lengths)):
        if index > places[-1] and user[index] and run >= step:
            places.append(index)
            run = 0
        run += lengths[index]
    return places


def fit(
    lengths: Sequence[int],
    user: Sequence[bool],
    *,
    tail: int,
    n_ctx: int,
    room: int,
    policy: Overflow,
) -> Cut:
    """The part of a path the model reads. `lengths[i]` is node i's token count (node 0 is
    the system prompt, always read; the last node is the message being answered), `user[i]`
    whether node i is a user message, `tail` the tokens that follow the path (the reply's
    prompt). Nothing is left out while the whole path fits (under STOP, always: the caller
    reports an overflow); else the cut is the first place after which the rest fits with
    `room` tokens to spare, or the last user message alone when no place does."""
    total = sum(lengths)
    if policy is Overflow.STOP or total + tail + room <= n_ctx or len(lengths) < 3:
        return Cut(1, total)
    head = lengths[0]
    suffix = [0] * (len(lengths) + 1)
    for index in range(len(lengths) - 1, -1, -1):
        suffix[index] = suffix[index + 1] + lengths[index]
    for place in cut_places(lengths, user, n_ctx // 4)[1:]:
        if head + suffix[place] + tail + room <= n_ctx:
            return Cut(place, head + suffix[place])
    # No place fits: keep the newest user message and what follows it (the reply being
    # continued, or nothing); if even that is too long, the caller reports an overflow.
    last_user = max((i for i in range(1, len(lengths)) if user[i]), default=len(lengths) - 1)
    return Cut(last_user, head + suffix[last_user])


def read_part(path: Sequence[T], cut: Cut) -> list[T]:
    """The nodes of `path` the model reads under `cut`: the system prompt and the rest."""
    return list(path) if cut.start <= 1 else [path[0], *path[cut.start:]]
