"""A message's `< n/m >` version switcher: its size, its place, what a click on it hits, and
its painting.

It sits at the right of the bubble's header line (app.chat.bubble_geometry places it), only on a
message with other versions: a "previous" arrow, the counter and a "next" arrow, each arrow a
square as tall as the header.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QPoint, QPointF, QRect, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPen

from app.chat.chat_model import MessageRow


@dataclass(frozen=True)
class Switcher:
    """Where a switcher's parts are painted; all empty for a message with one version."""

    left_arrow: QRect
    counter: QRect
    right_arrow: QRect

    @staticmethod
    def none() -> Switcher:
        """The switcher of a message with a single version: nothing to paint or click."""
        empty = QRect()
        return Switcher(empty, empty, empty)


def counter_text(row: MessageRow) -> str:
    """The counter's words: this version's number and how many there are."""
    return f"{row.variant + 1}/{row.variants}"


def counter_width(metrics: QFontMetrics, row: MessageRow) -> int:
    """The counter's width: room for its widest text, so it does not move between versions."""
    return metrics.horizontalAdvance(f"{row.variants}/{row.variants}") + 6


def place(right: int, top: int, arrow: int, counter_w: int) -> Switcher:
    """A switcher whose "next" arrow ends at `right` (exclusive), with arrows `arrow` square."""
    right_arrow = QRect(right - arrow, top, arrow, arrow)
    counter = QRect(right_arrow.left() - counter_w, top, counter_w, arrow)
    left_arrow = QRect(counter.left() - arrow, top, arrow, arrow)
    return Switcher(left_arrow, counter, right_arrow)


def arrow_at(switcher: Switcher, row: MessageRow, pos: QPoint) -> int:
    """-1 over an enabled "previous" arrow, +1 over an enabled "next" one, else 0."""
    if row.variants <= 1:
        return 0
    if switcher.left_arrow.contains(pos) and row.variant > 0:
        return -1
    if switcher.right_arrow.contains(pos) and row.variant + 1 < row.variants:
        return 1
    return 0


def paint_switcher(
    painter: QPainter,
    switcher: Switcher,
    row: MessageRow,
    font: QFont,
    enabled: QColor,
    disabled: QColor,
) -> None:
    """The counter, and each arrow as a chevron in `enabled` or, at either end, `disabled`."""
    painter.setFont(font)
    painter.setPen(enabled)
    painter.drawText(switcher.counter, Qt.AlignmentFlag.AlignCenter, counter_text(row))
    for rect, direction, active in (
        (switcher.left_arrow, -1, row.variant > 0),
        (switcher.right_arrow, 1, row.variant + 1 < row.variants),
    ):
        pen = QPen(enabled if active else disabled, 1.6)
        pen.setCapStyle(Qt.PenCapStyle.RoundCap)
        pen.setJoinStyle(Qt.PenJoinStyle.RoundJoin)
        painter.setPen(pen)
        center = QRectF(rect).center()
        half = rect.height() / 5.0
        tip = QPointF(center.x() + direction * half / 2, center.y())
        back = center.x() - direction * half / 2
        painter.drawPolyline(
            [QPointF(back, center.y() - half), tip, QPointF(back, center.y() + half)]
        )
