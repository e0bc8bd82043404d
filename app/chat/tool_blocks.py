"""Tool calls and results in a bubble: laid out as the data they are, monospaced, never read as
Markdown or HTML.

A reply's calls are blocks of their own below what it said: each a framed box on the code
background, a line naming the function and the arguments below it (`add_calls`, into the
message's own document, so they are sized, painted and clipped with it). A reply that only
calls tools shows its boxes and no empty line of prose above them.

A tool's result is the fold of its bubble (app.chat.reasoning_blocks); unfolded, its text is a
`verbatim_document`: plain text in the monospaced font, its lines and indentation kept and
long lines wrapped. Which text the two show is app.chat.tool_text's business.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFrameFormat,
    QTextOption,
)

from app.chat.code_blocks import label_font
from app.chat.message_documents import CODE_BACKGROUND, MessageDocument
from app.chat.tool_text import arguments_text
from engine.core.tools import ToolCall

BOX_PAD = 6  # inside a call's box and a result's
BOX_GAP = 8  # above a call's box, below the prose or the call before
CALL_LABEL = "Tool call"  # before the function's name


def mono_font(font: QFont) -> QFont:
    """`font` in the system's monospaced family, the same size."""
    mono = QFont(font)
    mono.setFamilies(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).families())
    mono.setStyleHint(QFont.StyleHint.TypeWriter)
    mono.setFixedPitch(True)
    return mono


def _wrapping(doc: QTextDocument) -> None:
    option = doc.defaultTextOption()
    option.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)  # long lines too
    doc.setDefaultTextOption(option)


def verbatim_document(text: str, font: QFont) -> MessageDocument:
    """`text` as plain text in a new document, monospaced: nothing in it is interpreted,
    every line and space is kept, and lines longer than the width wrap."""
    doc = MessageDocument()
    doc.setUndoRedoEnabled(False)
    doc.setDocumentMargin(0)
    doc.setDefaultFont(mono_font(font))
    _wrapping(doc)
    doc.setPlainText(text)
    return doc


def _hide_empty_lines(doc: QTextDocument, blank: bool) -> None:
    """Hide the empty lines Qt keeps around the boxes: after each box (a frame is always
    followed by a block), and before the first when there is no prose."""
    it = doc.rootFrame().begin()
    boxes = 0
    while not it.atEnd():
        if it.currentFrame() is not None:
            boxes += 1
        else:
            block = it.currentBlock()
            if block.isValid() and not block.text() and (boxes or blank):
                block.setVisible(False)  # an invisible block takes no height in the layout
        it += 1


def add_calls(doc: QTextDocument, calls: Sequence[ToolCall], font: QFont, dim: QColor) -> None:
    """Append a box per call to a message's document (after its prose): "Tool call" and the
    function's name, then its arguments, monospaced. With no prose, the document's empty
    first line is hidden; the empty line Qt keeps after the last box is hidden too."""
    if not calls:
        return
    blank = not doc.toPlainText().strip()
    label = QTextCharFormat()
    label.setFont(label_font(font))
    label.setForeground(dim)
    name = QTextCharFormat()
    name.setFont(mono_font(font))
    name.setFontWeight(QFont.Weight.Bold)
    code = QTextCharFormat()
    code.setFont(mono_font(font))
    cursor = QTextCursor(doc)
    for number, call in enumerate(calls):
        cursor.movePosition(QTextCursor.MoveOperation.End)
        box = QTextFrameFormat()
        box.setBackground(CODE_BACKGROUND)
        box.setPadding(BOX_PAD)
        box.setBorder(0)
        box.setTopMargin(0 if blank and number == 0 else BOX_GAP)
        frame = cursor.insertFrame(box)
        cursor.setBlockFormat(QTextBlockFormat())
        cursor.insertText(f"{CALL_LABEL} ", label)
        cursor.insertText(call.name, name)
        for line in arguments_text(call.arguments).split("\n"):
            cursor.insertBlock(QTextBlockFormat(), code)
            cursor.insertText(line, code)
        cursor.setPosition(frame.lastPosition() + 1)
    _hide_empty_lines(doc, blank)
    doc.markContentsDirty(0, doc.characterCount())
