"""The benchmark's conversations and cases, as data every system replays the same way.

A conversation of a target length is four long user turns (replies capped short), then the
cases, in the order a user might do them on one conversation:

  edit the last user message (changed in its middle), regenerate the last reply, edit the
  first user message, switch back to the original branch and send, continue an interrupted
  reply, and send after a warm-up (what the app does while the user reads or types; it
  warms before the continue too). The reply to continue is cut by `max_tokens`, so it is
  complete, not interrupted: the warm-up before it prepares the branch, not the continue
  (Conversation.warm_target), and the continue decodes the reply's tokens.

Each case is one measured reply. Arbor runs the whole session as one replay scenario; the
llama-cpp-python peers run the same operations as a chat app on their API performs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

PASSAGE = (
    "the river carries silt from the mountains to the delta where farmers plant rice in "
    "spring and harvest in autumn while herons wait in the shallows for fish and the old "
    "mill turns slowly beside the bridge that the village rebuilt after the flood"
)
WORDS = PASSAGE.split(" ")
# No system prompt: every system then renders the same prompt, the model's template with its
# own default (llama-cpp-python's "gemma" format would drop a system prompt that llama.cpp's
# folds into the first turn), so a text that differs is the cache's doing, not the template's.
SYSTEM = ""
TURNS = 4
REPLY_TOKENS = 16  # every reply's length: the benchmark measures prompts, not generation
INTERRUPTED_AT = 6  # the reply that is cut short, to be continued
# The prompt's template and reply tokens around the user text, per turn (an estimate used
# only to size the turns; the report gives the real prompt lengths).
TURN_OVERHEAD = REPLY_TOKENS + 12
MIN_TURN_WORDS = 8
EARLY_EDIT = "Tell me about rivers, briefly."
AFTER_SWITCH = "Thanks. And the herons?"
TO_INTERRUPT = "Describe the mill in a few sentences."
AFTER_WARM = "And the bridge?"


class Case(StrEnum):
    EDIT_LAST = "edit_last"
    REGENERATE = "regenerate"
    EDIT_EARLY = "edit_early"
    SWITCH_BACK = "switch_back"
    CONTINUE = "continue"
    WARM_SEND = "warm_send"

    @property
    def label(self) -> str:
        return _TITLES[self]


_TITLES = {
    Case.EDIT_LAST: "edit the last user message (in its middle)",
    Case.REGENERATE: "regenerate the last reply",
    Case.EDIT_EARLY: "edit the first user message",
    Case.SWITCH_BACK: "switch back to the original branch, then send",
    Case.CONTINUE: "continue an interrupted reply",
    Case.WARM_SEND: "send after a warm-up",
}
# The cases the targets speak of: Arbor decodes at most the new message plus TARGET_SLACK.
TARGET_CASES = (Case.SWITCH_BACK, Case.EDIT_EARLY, Case.REGENERATE)
TARGET_SLACK = 64
TARGET_SPEEDUP = 20.0  # TTFT of the plain app over Arbor's, at the longest length


def paragraph(n_words: int, offset: int) -> str:
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(n_words))


def turn_words(target_tokens: int, tokens_per_word: float) -> int:
    """Words per user turn so that TURNS turns (with their template and replies) come to
    about `target_tokens`."""
    if target_tokens <= 0 or tokens_per_word <= 0:
        raise ValueError("a conversation needs a positive length and tokens per word")
    per_turn = target_tokens / TURNS - TURN_OVERHEAD
    return max(MIN_TURN_WORDS, math.floor(per_turn / tokens_per_word))


@dataclass(frozen=True)
class Conversation:
    """One benchmark conversation: its nominal length and its user turns."""

    length: int  # the nominal length in tokens (the report gives the real one)
    turns: tuple[str, ...]

    @classmethod
    def of_length(cls, length: int, tokens_per_word: float) -> Conversation:
        words = turn_words(length, tokens_per_word)
        turns = tuple(f"Summarise this passage in one line: {paragraph(words, k * 7)}"
                      for k in range(TURNS))
        return cls(length, turns)

    @property
    def edited_last(self) -> str:
        """The last user message changed in its middle, not only at its end."""
        words = self.turns[-1].split(" ")
        middle = len(words) // 2
        return " ".join([*words[:middle], "(and mind the herons)", *words[middle:]])

    # --- Arbor: one replay scenario -----------------------------------------------------

    def scenario(self, model: str, *, n_ctx: int, n_batch: int) -> dict[str, Any]:
        """The whole session as a replay scenario; MEASURED maps its steps to cases."""
        send = [{"op": "send", "text": t, "max_tokens": REPLY_TOKENS} for t in self.turns]
        last_user = 2 * (TURNS - 1)  # message index on the active path, system excluded
        steps: list[dict[str, Any]] = [
            *send,
            {"op": "edit", "message": last_user, "text": self.edited_last,
             "max_tokens": REPLY_TOKENS},
            {"op": "regenerate", "max_tokens": REPLY_TOKENS},
            {"op": "edit", "message": 0, "text": EARLY_EDIT, "max_tokens": REPLY_TOKENS},
            {"op": "switch", "message": 0, "variant": 0},
            {"op": "send", "text": AFTER_SWITCH, "max_tokens": REPLY_TOKENS},
            {"op": "send", "text": TO_INTERRUPT, "max_tokens": INTERRUPTED_AT},
            {"op": "warm"},  # as the app does while the user reads the reply
            {"op": "continue", "max_tokens": REPLY_TOKENS},
            {"op": "warm"},
            {"op": "send", "text": AFTER_WARM, "max_tokens": REPLY_TOKENS},
        ]
        return {"model": model, "n_ctx": n_ctx, "n_batch": n_batch, "seed": 0,
                "sampling": {"temperature": 0.0}, "system": SYSTEM, "steps": steps}


# Replay step index -> case (see Conversation.scenario), and the step of the setup's last send.
MEASURED: dict[int, Case] = {
    TURNS: Case.EDIT_LAST, TURNS + 1: Case.REGENERATE, TURNS + 2: Case.EDIT_EARLY,
    TURNS + 4: Case.SWITCH_BACK, TURNS + 7: Case.CONTINUE, TURNS + 9: Case.WARM_SEND,
}
SETUP_LAST = TURNS - 1
# The new message of each case, whose tokens the decode target allows (None: nothing new).
NEW_TEXT: dict[Case, str | None] = {
    Case.EDIT_EARLY: EARLY_EDIT, Case.SWITCH_BACK: AFTER_SWITCH, Case.REGENERATE: None,
}


def rotation(systems: list[str], round_index: int) -> list[str]:
    """The systems' order in a round: rotated each round, so that every system goes first
    (and follows every other) equally often over the rounds (A B C D, B C D A, ...)."""
    if not systems:
        return []
    k = round_index % len(systems)
    return systems[k:] + systems[:k]
