"""The message bubbles' Markdown documents and colours: building, shading, caching.

`MessageDelegate` (app.chat.message_delegate) lays out each message's Markdown in a
`MessageDocument`: `markdown_document` builds one, `shade_code` and `colour_links` finish it (a
faint background for code, links in the palette's colour) and `remember` keeps the
delegate's LRU caches keyed (node id, text hash, width). `mix` blends the bubbles' colours and
`code_background` is what a code block's background looks like on a bubble. The code blocks
themselves (where they are, their exact code, their colours) are app.chat.code_blocks'.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtGui import (
    QColor,
    QFont,
    QTextBlock,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextOption,
)

from app.chat.code_blocks import CodeBlock

if TYPE_CHECKING:
    from app.chat.reasoning_blocks import ReasoningBlock


def mix(a: QColor, b: QColor, amount: float) -> QColor:
    """`a` moved `amount` (0..1) of the way towards `b`; works the same on light and dark."""
    return QColor.fromRgbF(
        a.redF() + (b.redF() - a.redF()) * amount,
        a.greenF() + (b.greenF() - a.greenF()) * amount,
        a.blueF() + (b.blueF() - a.blueF()) * amount,
        1.0,
    )


# Translucent grey reads on both light and dark bubbles, so a theme switch need not touch it
# (the link colour does go into cached documents: see `ChatView.changeEvent`).
CODE_BACKGROUND = QColor(128, 128, 128, 48)


def code_background(fill: QColor) -> QColor:
    """The opaque colour of a code block's background on a bubble filled with `fill`."""
    return mix(fill, CODE_BACKGROUND, CODE_BACKGROUND.alphaF())


class MessageDocument(QTextDocument):
    """A message's laid-out Markdown, with its code blocks (app.chat.code_blocks) and, for a
    reply that has some, its reasoning above the answer (app.chat.reasoning_blocks; the document
    then holds the answer only).

    `highlighted` is set once its code has been coloured: that happens when the message is
    first painted finished, never while it streams.
    """

    def __init__(self) -> None:
        super().__init__()
        self.code_blocks: tuple[CodeBlock, ...] = ()
        self.reasoning: ReasoningBlock | None = None
        self.highlighted = False


def markdown_document(text: str, font: QFont) -> MessageDocument:
    """`text` as Markdown in a new document in `font`: no margin, no undo, wrapping anywhere."""
    doc = MessageDocument()
    doc.setUndoRedoEnabled(False)
    doc.setDocumentMargin(0)
    doc.setDefaultFont(font)
    option = doc.defaultTextOption()
    option.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)  # long URLs too
    doc.setDefaultTextOption(option)
    doc.setMarkdown(text)
    return doc


def merge_where(
    cursor: QTextCursor, block: QTextBlock, wanted: Callable[[QTextCharFormat], bool],
    fmt: QTextCharFormat,
) -> None:
    """Merge `fmt` into every fragment of `block` whose character format `wanted` accepts."""
    it = block.begin()
    while not it.atEnd():
        fragment = it.fragment()
        if fragment.isValid() and wanted(fragment.charFormat()):
            cursor.setPosition(fragment.position())
            cursor.setPosition(
                fragment.position() + fragment.length(), QTextCursor.MoveMode.KeepAnchor
            )
            cursor.mergeCharFormat(fmt)
        it += 1


def shade_code(doc: QTextDocument) -> None:
    """Give fenced code blocks and inline code a faint background (the importer only sets
    the monospace font)."""
    cursor = QTextCursor(doc)
    shade = QTextCharFormat()
    shade.setBackground(CODE_BACKGROUND)
    block = doc.begin()
    while block.isValid():
        fmt = block.blockFormat()
        if fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines():
            fmt.setBackground(CODE_BACKGROUND)
            # Wrap long code lines rather than paint past the bubble (no sideways scrolling).
            fmt.setNonBreakableLines(False)
            cursor.setPosition(block.position())
            cursor.setBlockFormat(fmt)
        else:
            merge_where(cursor, block, QTextCharFormat.fontFixedPitch, shade)
        block = block.next()


def colour_links(doc: QTextDocument, colour: QColor) -> None:
    """Paint links in `colour`: the Markdown importer bakes in the application palette's
    link colour of the moment, which is unreadable once the theme turns dark (#0000ff)."""
    cursor = QTextCursor(doc)
    link = QTextCharFormat()
    link.setForeground(colour)
    block = doc.begin()
    while block.isValid():
        merge_where(cursor, block, QTextCharFormat.isAnchor, link)
        block = block.next()


def remember(
    cache: OrderedDict[tuple[int, int, int], Any],
    latest: dict[tuple[int, int], tuple[int, int, int]],
    key: tuple[int, int, int],
    value: object,
    limit: int,
) -> None:
    """Put `value` in an LRU `cache` keyed (node id, text hash, width), replacing the entry
    for the same node and width with an older text, and evicting beyond `limit`."""
    node_id, _text_hash, width = key
    older = latest.get((node_id, width))
    if older is not None and older != key:
        cache.pop(older, None)
    latest[(node_id, width)] = key
    cache[key] = value
    while len(cache) > limit:
        gone, _ = cache.popitem(last=False)
        if latest.get((gone[0], gone[2])) == gone:
            del latest[(gone[0], gone[2])]
