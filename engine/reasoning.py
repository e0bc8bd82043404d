"""A reply's reasoning: the `<think>...</think>` part reasoning models write before the answer.

Arbor keeps a reply's text exactly as the model wrote it (the markers included), so the
prompt of the next turn holds what the model produced. This module only reads that text: the
window shows the reasoning as a collapsible block, the exports write it as a marked section.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The markers reasoning models use (Qwen3, DeepSeek-R1, QwQ, SmolLM3...: `<think>`; a few
# older templates: `<thinking>`). A reply's reasoning opens with one of them, at its start.
MARKERS: tuple[tuple[str, str], ...] = (("<think>", "</think>"), ("<thinking>", "</thinking>"))


class ReasoningState(StrEnum):
    NONE = "none"  # the reply has no reasoning
    OPEN = "open"  # the reasoning has not ended (still streaming, or the reply was cut short)
    CLOSED = "closed"  # the reasoning ended; what follows is the answer


@dataclass(frozen=True)
class Reasoning:
    """A reply's text split into its reasoning and its answer."""

    reasoning: str  # without the markers and the whitespace around it
    answer: str  # the text after the closing marker, without leading whitespace
    state: ReasoningState

    @property
    def words(self) -> int:
        return len(self.reasoning.split())


def split_reasoning(text: str) -> Reasoning:
    """Split a reply's text. Reasoning counts only at the start of the reply (after
    whitespace); a `<think>` further down is part of the answer, as written. Some templates
    put the opening marker in the generation prompt, so the model writes only the closing
    one: a text that has a closing marker and no opening one is reasoning up to it."""
    stripped = text.lstrip()
    for opening, closing in MARKERS:
        if stripped.startswith(opening):
            body = stripped[len(opening):]
            end = body.find(closing)
            if end < 0:
                return Reasoning(body.strip(), "", ReasoningState.OPEN)
            return Reasoning(body[:end].strip(), body[end + len(closing):].lstrip(),
                             ReasoningState.CLOSED)
    for opening, closing in MARKERS:
        end = text.find(closing)
        if end >= 0 and opening not in text[:end]:
            return Reasoning(text[:end].strip(), text[end + len(closing):].lstrip(),
                             ReasoningState.CLOSED)
    return Reasoning("", text, ReasoningState.NONE)
