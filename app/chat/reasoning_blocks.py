"""A reply's reasoning in its bubble: a disclosure header above the answer, and when unfolded
the reasoning itself, smaller and dimmer, between the header and the answer.

The answer is the message's document (app.chat.message_documents); the reasoning takes room above
its first line, as a code block's strip does (app.chat.code_blocks): `make_room` gives the
document a top margin of the reasoning's height, and the delegate paints the header and the
reasoning's own document in that room. Which text is reasoning is engine.core.reasoning's business;
whether it is unfolded is the chat model's (app.chat.chat_model).

A tool's result is folded the same way, but it is data, not prose: unfolded, it is shown
verbatim and monospaced on the code background in the text's colour (`verbatim`; its document
is app.chat.tool_blocks'), not as dim Markdown.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QPointF, QRectF, Qt
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

from app.chat.code_blocks import label_font
from app.chat.message_documents import CODE_BACKGROUND, markdown_document
from app.chat.tool_blocks import BOX_PAD, verbatim_document
from app.chat.tool_text import result_text

INDENT = 12  # the reasoning's left inset, right of its rule
GAP = 6  # below the header, and between the reasoning and the answer
_LEFT_MIDDLE = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter


@dataclass(frozen=True)
class ReasoningBlock:
    """What a message's document knows of its reasoning: the header's words, whether it is
    unfolded, and then its laid-out document."""

    label: str
    shown: bool
    document: QTextDocument | None  # the reasoning, laid out `INDENT` narrower than the answer
    header_height: int
    verbatim: bool = False  # a tool's result: plain text in a box, `BOX_PAD` inside it

    @property
    def body_height(self) -> int:
        """The unfolded text's height (its box's, for a result); 0 when folded."""
        if self.document is None:
            return 0
        pad = 2 * BOX_PAD if self.verbatim else 0
        return round(self.document.size().height()) + pad

    @property
    def height(self) -> int:
        """The room above the answer's first line."""
        if self.document is None:
            return self.header_height + GAP
        return self.header_height + GAP + self.body_height + GAP

    def header_rect(self, width: float) -> QRectF:
        """The header (the click target), in the message document's coordinates."""
        return QRectF(0.0, 0.0, width, self.header_height)


def header_height(font: QFont) -> int:
    return QFontMetrics(label_font(font)).height() + 6


def reasoning_block(
    reasoning: str, label: str, shown: bool, font: QFont, width: int, verbatim: bool = False
) -> ReasoningBlock:
    """The reasoning of a reply laid out `width` pixels wide (its text only when shown);
    `verbatim`: a tool's result, shown as it came (JSON laid out for reading)."""
    document = None
    if shown and verbatim:
        document = verbatim_document(result_text(reasoning), font)
        document.setTextWidth(max(20, width - 2 * BOX_PAD))
    elif shown:
        document = markdown_document(reasoning, label_font(font))
        document.setTextWidth(max(20, width - INDENT))
    return ReasoningBlock(label, shown, document, header_height(font), verbatim)


def make_room(doc: QTextDocument, block: ReasoningBlock) -> None:
    """Room above the answer for the reasoning: the root frame's top margin (Qt's layout
    drops the first block's own top margin, so a code block's strip there is added too and
    stays just above its code).

    With no answer (a tool's result is all fold; a reply cut off, or still streaming, inside
    its reasoning) the fold is the whole message: the document's one empty block would be
    an empty line below it, so it is hidden, and the gap kept above an answer is dropped."""
    room = block.height + doc.begin().blockFormat().topMargin()
    if doc.isEmpty():
        doc.begin().setVisible(False)  # an invisible block takes no height in the layout
        doc.markContentsDirty(0, doc.characterCount())
        room = block.height - GAP
    frame = doc.rootFrame()
    fmt = frame.frameFormat()
    fmt.setTopMargin(room)
    frame.setFrameFormat(fmt)


def paint(painter: QPainter, block: ReasoningBlock, font: QFont, width: float,
          dim: QColor, text: QColor) -> None:
    """The header (a triangle pointing right when folded, down when unfolded, and the label)
    and the unfolded reasoning, in dim colours (a result: in `text` on the code background);
    in the message document's coordinates."""
    small = label_font(font)
    header = block.header_rect(width)
    size = header.height() / 3.2
    middle = QPointF(header.left() + size, header.center().y())
    if block.shown:
        triangle = [QPointF(middle.x() - size * 0.6, middle.y() - size * 0.35),
                    QPointF(middle.x() + size * 0.6, middle.y() - size * 0.35),
                    QPointF(middle.x(), middle.y() + size * 0.45)]
    else:
        triangle = [QPointF(middle.x() - size * 0.35, middle.y() - size * 0.6),
                    QPointF(middle.x() - size * 0.35, middle.y() + size * 0.6),
                    QPointF(middle.x() + size * 0.45, middle.y())]
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(dim)
    painter.drawPolygon(triangle)
    painter.setFont(small)
    painter.setPen(dim)
    label_rect = header.adjusted(2 * size + 4, 0, 0, 0)
    painter.drawText(label_rect, _LEFT_MIDDLE, block.label)
    if block.document is None:
        return
    top = header.bottom() + GAP
    if block.verbatim:
        painter.fillRect(QRectF(0.0, top, width, block.body_height), CODE_BACKGROUND)
        painter.save()
        painter.translate(BOX_PAD, top + BOX_PAD)
        _draw_dim(painter, block.document, text)
        painter.restore()
        return
    height = block.document.size().height()
    painter.setPen(QPen(dim, 2.0))
    painter.drawLine(QPointF(size, top), QPointF(size, top + height))
    painter.save()
    painter.translate(INDENT, top)
    _draw_dim(painter, block.document, dim)
    painter.restore()


def _draw_dim(painter: QPainter, document: QTextDocument, dim: QColor) -> None:
    """Draw `document` with its text in `dim` (links and code keep their own colours; a
    result is drawn in the text's colour this way)."""
    context = QAbstractTextDocumentLayout.PaintContext()
    palette = QPalette()
    palette.setColor(QPalette.ColorRole.Text, dim)
    context.palette = palette
    document.documentLayout().draw(painter, context)
