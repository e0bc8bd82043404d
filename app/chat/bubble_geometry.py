"""Where a message bubble's parts go in its item: the bubble, its header line, its text and
its version switcher (app.chat.version_switcher).

A reply's bubble takes the item's width less the margins; a user's is at most `USER_WIDTH`
of it (but `MIN_USER_WIDTH` wide if it can) and, given the width its text wants, just wide
enough for that text and its header, right-aligned. The header (role, markers, switcher) is
one line at the top; the text starts `HEADER_GAP` below it. None of it needs the text laid
out except the user bubble's width.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QPoint, QRect
from PySide6.QtGui import QFont, QFontMetrics

from app.chat.chat_model import ASSISTANT, INTERRUPTED, STREAMING, USER, MessageRow
from app.chat.version_switcher import Switcher, counter_width, place

MARGIN_H = 12  # outside the bubble, left and right
MARGIN_V = 5  # outside the bubble, above and below
PADDING = 10  # inside the bubble
HEADER_GAP = 4  # between the header line and the text
USER_WIDTH = 0.8  # user bubbles are at most this share of the width
MIN_USER_WIDTH = 260
ROLE_LABELS: dict[str, str] = {USER: "You", ASSISTANT: "Assistant", "tool": "Tool result"}
DIVIDER_TEXT = "Earlier messages are outside the context"


@dataclass(frozen=True)
class BubbleGeometry:
    """A bubble's rectangles in its item (view coordinates)."""

    bubble: QRect
    header: QRect
    text_origin: QPoint  # the top left of the text's document
    switcher: Switcher

    def text_area(self) -> QRect:
        """Where the text goes, down to the bubble's bottom padding."""
        bottom_right = QPoint(self.bubble.right() - PADDING, self.bubble.bottom() - PADDING)
        return QRect(self.text_origin, bottom_right)


def role_label(role: str) -> str:
    """The header's name for a role ("You", "Assistant")."""
    return ROLE_LABELS.get(role, role)


def markers(row: MessageRow) -> str:
    """What the header says after the role: still streaming, interrupted, outside the
    context, a checkpoint."""
    parts: list[str] = []
    if row.status == STREAMING:
        parts.append("…")
    elif row.status == INTERRUPTED:
        parts.append("· interrupted")
    if row.outside:
        parts.append("· outside the context")
    if row.checkpoint:
        parts.append(f"· ⚑ {row.checkpoint}")
    return " ".join(parts)


def _available(width: int) -> int:
    """Widest a bubble can be in an item `width` pixels wide."""
    return max(2 * PADDING + 40, width - 2 * MARGIN_H)


def max_bubble(role: str, width: int) -> int:
    """Widest a bubble of `role` can be in an item `width` pixels wide."""
    available = _available(width)
    if role == USER:
        return min(available, max(int(available * USER_WIDTH), MIN_USER_WIDTH))
    return available


def text_width(role: str, item_width: int) -> int:
    """The width the Markdown text is laid out at, for an item `item_width` wide."""
    return max_bubble(role, item_width) - 2 * PADDING


def header_height(metrics: QFontMetrics) -> int:
    """The header line's height (also the switcher's arrows' size)."""
    return metrics.height() + 2


def divider_height(font: QFont, row: MessageRow) -> int:
    """The band above the first message the last reply read after leaving older ones out
    (`DIVIDER_TEXT`); 0 for every other message."""
    return QFontMetrics(font).height() + 2 * MARGIN_V if row.context_starts else 0


def frame_height(font: QFont) -> int:
    """A bubble's height without its text: margins, padding and the header line."""
    return 2 * MARGIN_V + 2 * PADDING + header_height(QFontMetrics(font)) + HEADER_GAP


def bubble_geometry(
    rect: QRect, row: MessageRow, font: QFont, ideal_width: int | None = None
) -> BubbleGeometry:
    """The bubble of `row` in an item at `rect`; a user's bubble is fitted to `ideal_width`
    (its text's wanted width) when given, else it takes its widest."""
    metrics = QFontMetrics(font)
    bold = QFont(font)
    bold.setBold(True)
    header_h = header_height(metrics)
    arrow = header_h
    counter_w = counter_width(metrics, row)
    switcher_w = 2 * arrow + counter_w if row.variants > 1 else 0
    widest = max_bubble(row.role, rect.width())
    if row.role == USER and ideal_width is not None:
        header_w = QFontMetrics(bold).horizontalAdvance(role_label(row.role))
        words = markers(row)
        if words:
            header_w += metrics.horizontalAdvance(" " + words)
        if switcher_w:
            header_w += 12 + switcher_w
        width = min(widest, max(ideal_width, header_w) + 2 * PADDING)
    else:
        width = widest
    divider = divider_height(font, row)
    top = rect.top() + MARGIN_V + divider
    height = rect.height() - 2 * MARGIN_V - divider
    right = rect.right() - MARGIN_H
    left = right - width + 1 if row.role == USER else rect.left() + MARGIN_H
    bubble = QRect(left, top, width, height)
    header = QRect(left + PADDING, top + PADDING, width - 2 * PADDING, header_h)
    text_origin = QPoint(left + PADDING, header.bottom() + 1 + HEADER_GAP)
    if switcher_w:
        switcher = place(bubble.right() - PADDING + 1, header.top(), arrow, counter_w)
    else:
        switcher = Switcher.none()
    return BubbleGeometry(bubble, header, text_origin, switcher)
