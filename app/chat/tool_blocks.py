"""Tool results in a bubble: laid out as the data they are, monospaced, never read as
Markdown or HTML.

A tool's result is the fold of its bubble (app.chat.reasoning_blocks); unfolded, its text is a
`verbatim_document`: plain text in the monospaced font, its lines and indentation kept and
long lines wrapped. Which text it shows is app.chat.tool_text's business.
"""

from __future__ import annotations

from PySide6.QtGui import (
    QFont,
    QFontDatabase,
    QTextDocument,
    QTextOption,
)

from app.chat.message_documents import MessageDocument

BOX_PAD = 6  # inside a result's box


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
