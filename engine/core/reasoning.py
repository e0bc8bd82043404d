"""A reply's reasoning: the `<think>...</think>` part reasoning models write before the answer.

Arbor keeps a reply's text exactly as the model wrote it (the markers included), so the
prompt of the next turn holds what the model produced. This module only reads that text: the
window shows the reasoning as a collapsible block, the exports write it as a marked section.

Some templates (DeepSeek-R1's, Qwen3's in thinking mode) end the generation prompt with the
opening marker, so the model writes only the closing one. Whether a reply began so is known
only where it was generated: the engine keeps it in the reply's meta (`OPENED`). Without it a
closing marker is the answer's own text: a reply may well mention `</think>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

# The markers reasoning models use (Qwen3, DeepSeek-R1, QwQ, SmolLM3...: `<think>`; a few
# older templates: `<thinking>`). A reply's reasoning opens with one of them, at its start.
MARKERS: tuple[tuple[str, str], ...] = (("<think>", "</think>"), ("<thinking>", "</thinking>"))

# Reply meta: True when the generation prompt the reply was written after ended with an
# opening marker (the reply starts inside its reasoning). Missing (older stores, imports,
# edits): False.
OPENED = "reasoning_opened"


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


def split_reasoning(text: str, opened: bool = False) -> Reasoning:
    """Split a reply's text. Reasoning counts only at the start of the reply (after
    whitespace); a marker further down is part of the answer, as written. `opened`: the
    generation prompt ended with an opening marker (`opens_reasoning`), so the text starts
    inside the reasoning and runs up to the first closing marker."""
    stripped = text.lstrip()
    for opening, closing in MARKERS:
        if stripped.startswith(opening):
            return _split(stripped[len(opening):], closing)
    if opened:
        closings = [closing for _, closing in MARKERS if closing in text]
        first = min(closings, key=text.find) if closings else MARKERS[0][1]
        return _split(text, first)
    return Reasoning("", text, ReasoningState.NONE)


def _split(body: str, closing: str) -> Reasoning:
    """`body` is reasoning up to `closing`, the answer after it."""
    end = body.find(closing)
    if end < 0:
        return Reasoning(body.strip(), "", ReasoningState.OPEN)
    return Reasoning(body[:end].strip(), body[end + len(closing):].lstrip(),
                     ReasoningState.CLOSED)


def opens_reasoning(prompt: str) -> bool:
    """Whether a generation prompt leaves the reply inside reasoning: it ends (whitespace
    aside) with an opening marker."""
    return reasoning_closer(prompt) is not None


def reasoning_closer(prompt: str) -> str | None:
    """The marker that ends the reasoning a generation prompt opened; None if it opened none."""
    tail = prompt.rstrip()
    return next((closing for opening, closing in MARKERS if tail.endswith(opening)), None)


def is_opened(meta: Mapping[str, object]) -> bool:
    """A reply's `OPENED` flag from its meta (missing or odd: not opened)."""
    return meta.get(OPENED) is True
