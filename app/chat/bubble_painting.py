"""Painting a message bubble: its colours, its rounded shape, its header line and its text.

The delegate (app.chat.message_delegate) paints a row in this order, inside one save/restore of
the painter: `paint_bubble`, `paint_header` (role, markers, the switcher of
app.chat.version_switcher), then `paint_text`, which leaves the painter in the text document's
coordinates for what is painted over the text (app.chat.code_strips, app.chat.reasoning_blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QPointF, QRect, QRectF, Qt
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QColor,
    QFont,
    QFontMetrics,
    QPainter,
    QPalette,
    QPen,
    QTextDocument,
)

from app.chat.bubble_geometry import (
    DIVIDER_TEXT,
    MARGIN_H,
    MARGIN_V,
    BubbleGeometry,
    markers,
    role_label,
)
from app.chat.chat_model import INTERRUPTED, USER, MessageRow
from app.chat.message_documents import mix
from app.chat.version_switcher import paint_switcher

RADIUS = 9.0  # the bubble's corners
OUTSIDE_OPACITY = 0.55  # a message the last reply no longer read
_LEFT_MIDDLE = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter


@dataclass(frozen=True)
class BubbleColours:
    """A bubble's fill and the colours painted on it: text, and dim for what is secondary."""

    text: QColor
    dim: QColor
    fill: QColor


def bubble_colours(palette: QPalette, role: str) -> BubbleColours:
    """A user's bubble is tinted with the highlight colour, a reply's with the text's."""
    base = palette.color(QPalette.ColorRole.Base)
    text = palette.color(QPalette.ColorRole.Text)
    if role == USER:
        fill = mix(base, palette.color(QPalette.ColorRole.Highlight), 0.22)
    else:
        fill = mix(base, text, 0.06)
    return BubbleColours(text, mix(text, fill, 0.45), fill)


def paint_bubble(painter: QPainter, bubble: QRect, palette: QPalette, fill: QColor,
                 selected: bool) -> None:
    """The bubble's rounded shape in `fill`, outlined in the highlight colour when selected."""
    if selected:
        painter.setPen(QPen(palette.color(QPalette.ColorRole.Highlight), 1.5))
    else:
        painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(fill)
    painter.drawRoundedRect(QRectF(bubble).adjusted(0.5, 0.5, -0.5, -0.5), RADIUS, RADIUS)


def paint_header(
    painter: QPainter,
    geometry: BubbleGeometry,
    row: MessageRow,
    font: QFont,
    palette: QPalette,
    colours: BubbleColours,
) -> None:
    """The header line: the role's name in bold, then the markers (elided before the
    switcher; an interruption in red), then the switcher at the right."""
    header = geometry.header
    bold = QFont(font)
    bold.setBold(True)
    label = role_label(row.role)
    painter.setFont(bold)
    painter.setPen(colours.text)
    label_w = QFontMetrics(bold).horizontalAdvance(label)
    painter.drawText(header, _LEFT_MIDDLE, label)
    words = markers(row)
    if words:
        painter.setFont(font)
        marker_rect = QRect(header)
        marker_rect.setLeft(header.left() + label_w + QFontMetrics(font).horizontalAdvance(" "))
        if row.variants > 1:
            marker_rect.setRight(geometry.switcher.left_arrow.left() - 4)
        if row.status == INTERRUPTED:
            painter.setPen(mix(palette.color(QPalette.ColorRole.Text), QColor(220, 60, 40), 0.7))
        else:
            painter.setPen(colours.dim)
        elided = QFontMetrics(font).elidedText(
            words, Qt.TextElideMode.ElideRight, max(0, marker_rect.width())
        )
        painter.drawText(marker_rect, _LEFT_MIDDLE, elided)
    if row.variants > 1:
        paint_switcher(painter, geometry.switcher, row, font, colours.text, colours.dim)


def paint_text(
    painter: QPainter,
    doc: QTextDocument,
    geometry: BubbleGeometry,
    palette: QPalette,
    text: QColor,
    visible: QRectF,
) -> None:
    """The laid-out text in `text`, only where it meets `visible` (view coordinates) and cut
    at the bubble's edge (a wide table). Leaves the painter translated to the document's
    origin and clipped to the bubble: the caller's `restore` undoes both."""
    painter.translate(geometry.text_origin)
    origin = QPointF(geometry.text_origin)
    context = QAbstractTextDocumentLayout.PaintContext()
    text_palette = QPalette(palette)
    text_palette.setColor(QPalette.ColorRole.Text, text)
    context.palette = text_palette
    context.clip = visible.translated(-origin)
    painter.setClipRect(QRectF(geometry.bubble).translated(-origin), Qt.ClipOperation.IntersectClip)
    doc.documentLayout().draw(painter, context)


def paint_divider(painter: QPainter, item: QRect, bubble_top: int, font: QFont,
                  colour: QColor) -> None:
    """The band above the first message the last reply read when the context was full: a
    rule with `DIVIDER_TEXT` in its middle, across the item."""
    metrics = QFontMetrics(font)
    text_w = metrics.horizontalAdvance(DIVIDER_TEXT)
    band = QRect(item.left() + MARGIN_H, item.top(), item.width() - 2 * MARGIN_H,
                 bubble_top - MARGIN_V - item.top())
    middle = band.center().y()
    gap = 8
    painter.save()
    painter.setFont(font)
    painter.setPen(QPen(colour, 1, Qt.PenStyle.DashLine))
    left_end = band.center().x() - text_w // 2 - gap
    right_start = band.center().x() + text_w // 2 + gap
    if left_end > band.left():
        painter.drawLine(band.left(), middle, left_end, middle)
        painter.drawLine(right_start, middle, band.right(), middle)
    painter.setPen(colour)
    painter.drawText(band, Qt.AlignmentFlag.AlignCenter,
                     metrics.elidedText(DIVIDER_TEXT, Qt.TextElideMode.ElideRight, band.width()))
    painter.restore()
