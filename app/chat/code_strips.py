"""The strip painted above each code block of a bubble: its language and its copy button.

app.chat.code_blocks finds the blocks and makes room for a strip above each (`make_room`, with
`strip_height` here); this module sizes the strips and their buttons, says where the buttons
are in the view (for clicks, hovering and tooltips) and paints them. A button appears once the
message is finished, never while it streams; hovered it is filled, just used it says "Copied".
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRect, QRectF, Qt
from PySide6.QtGui import QFont, QFontMetrics, QPainter, QPen

from app.chat.bubble_geometry import PADDING, BubbleGeometry
from app.chat.bubble_painting import BubbleColours
from app.chat.chat_model import STREAMING, MessageRow
from app.chat.code_blocks import CodeBlock, label_font, strip_rect
from app.chat.message_documents import CODE_BACKGROUND, MessageDocument, mix

STRIP_PAD = 5  # above and below the strip's label
BUTTON_PAD = 8  # left and right of the copy button's label
COPY_LABELS = ("Copy", "Copied")  # before, just after a copy


def strip_height(font: QFont) -> int:
    """The height of the strip above a code block (its language and copy button)."""
    return QFontMetrics(label_font(font)).height() + 2 * STRIP_PAD


def button_width(font: QFont) -> int:
    """A copy button's width: room for the longer of its two labels."""
    metrics = QFontMetrics(label_font(font))
    return max(metrics.horizontalAdvance(t) for t in COPY_LABELS) + 2 * BUTTON_PAD


def strips_width(blocks: tuple[CodeBlock, ...], font: QFont) -> int:
    """The least text width at which every strip holds its language and its button (0
    without code blocks)."""
    if not blocks:
        return 0
    metrics = QFontMetrics(label_font(font))
    language = max(metrics.horizontalAdvance(c.language) for c in blocks)
    return language + button_width(font) + 3 * STRIP_PAD


def code_widths(doc: MessageDocument, bubble: QRect) -> tuple[float, float]:
    """How wide a code strip's background is (as wide as the code lines' background, which a
    narrow user bubble cuts at its edge) and how far its controls reach (the text's right
    edge)."""
    inner = bubble.width() - PADDING
    return min(doc.textWidth(), inner), min(doc.textWidth(), inner - PADDING)


def button_in_strip(strip: QRectF, font: QFont) -> QRectF:
    """The copy button at the right end of `strip`."""
    inset = 2.0
    width = button_width(font)
    return QRectF(strip.right() - width - inset, strip.top() + inset, width,
                  strip.height() - 2 * inset)


def button_rects(doc: MessageDocument, geometry: BubbleGeometry, font: QFont) -> list[QRect]:
    """The copy buttons of `doc`'s code blocks in order, in view coordinates."""
    _background, width = code_widths(doc, geometry.bubble)
    height = strip_height(font)
    origin = QPointF(geometry.text_origin)
    return [
        button_in_strip(strip_rect(doc, code, height, width), font)
        .translated(origin).toAlignedRect()
        for code in doc.code_blocks
    ]


def paint_code_strips(
    painter: QPainter,
    doc: MessageDocument,
    row: MessageRow,
    font: QFont,
    geometry: BubbleGeometry,
    colours: BubbleColours,
    hovered: tuple[int, int] | None,
    copied: tuple[int, int] | None,
) -> None:
    """Each code block's strip (in document coordinates): its language, and its copy button
    once the message is finished (`hovered`: filled; `copied`: "Copied"; both are (node id,
    code block index))."""
    background, controls = code_widths(doc, geometry.bubble)
    text, dim, fill = colours.text, colours.dim, colours.fill
    painter.setFont(label_font(font))
    height = strip_height(font)
    align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
    for number, code in enumerate(doc.code_blocks):
        strip = strip_rect(doc, code, height, controls)
        painter.fillRect(strip_rect(doc, code, height, background), CODE_BACKGROUND)
        if code.language:
            painter.setPen(dim)
            painter.drawText(strip.adjusted(STRIP_PAD + 1, 0, 0, 0), align, code.language)
        if row.status == STREAMING:
            continue
        button = button_in_strip(strip, font)
        is_hovered = hovered == (row.node_id, number)
        is_copied = copied == (row.node_id, number)
        painter.setPen(QPen(text if is_hovered else dim, 1.0))
        painter.setBrush(mix(fill, text, 0.18) if is_hovered else Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(button.adjusted(0.5, 0.5, -0.5, -0.5), 4.0, 4.0)
        painter.setPen(text if is_hovered or is_copied else dim)
        painter.drawText(button, Qt.AlignmentFlag.AlignCenter, COPY_LABELS[1 if is_copied else 0])
