"""The chat view's delegate: each message painted as a bubble with Markdown text.

`MessageDelegate` paints each row as a bubble with Markdown text: a role header with the
`< n/m >` version switcher, and over each fenced code block a strip with its language and a copy
button (the blocks: app.chat.code_blocks; coloured once a message is painted finished, never while
it streams), above a reply's answer its reasoning as a disclosure that a click folds or unfolds
(app.chat.reasoning_blocks), and below a reply's text its tool calls, each a box of its own (a
tool's result is such a disclosure, its text verbatim: app.chat.tool_blocks). Laid-out documents
live in a bounded LRU cache keyed by (node id, hash of the text, the calls and the reasoning's
fold, width), shared by `sizeHint` and `paint`; row
heights have their own (much larger, tiny-entry) cache because `QListView` asks every row for
its size on each relayout, which would otherwise thrash the document cache on long
conversations. The documents are finished and cached with the helpers of app.chat.message_documents;
the in-place `MessageEditor` for the one message being edited is hosted by the base class,
`EditingDelegate` (app.chat.editing_delegate).

This class holds the caches, Qt's delegate interface (size, paint, tooltips, clicks) and the
hit tests the view asks for; the parts it paints have modules of their own: where a bubble's
parts go (app.chat.bubble_geometry), painting the bubble, header and text
(app.chat.bubble_painting),
the switcher (app.chat.version_switcher) and the code blocks' strips and copy buttons
(app.chat.code_strips).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from typing import ClassVar

from PySide6.QtCore import (
    QAbstractItemModel,
    QEvent,
    QPoint,
    QPointF,
    QRect,
    QRectF,
    QSize,
    Qt,
    Signal,
)
from PySide6.QtGui import (
    QColor,
    QFont,
    QHelpEvent,
    QKeySequence,
    QMouseEvent,
    QPainter,
    QPalette,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QStyle,
    QStyleOptionViewItem,
    QToolTip,
    QWidget,
)

from app.chat import bubble_geometry as bubble
from app.chat import bubble_painting, code_strips
from app.chat.bubble_geometry import bubble_geometry, divider_height, frame_height
from app.chat.bubble_painting import (
    OUTSIDE_OPACITY,
    bubble_colours,
    paint_bubble,
    paint_divider,
    paint_header,
    paint_text,
)
from app.chat.chat_model import (
    COMPLETE,
    STREAMING,
    TOOL,
    USER,
    ChatModel,
    ChatRole,
    MessageRow,
    ModelIndex,
    reasoning_label,
    reasoning_of,
    reasoning_shown,
)
from app.chat.code_blocks import TokenFormats, find_code_blocks, highlight, make_room
from app.chat.code_strips import button_rects, paint_code_strips, strip_height, strips_width
from app.chat.editing_delegate import EditingDelegate
from app.chat.message_documents import (
    MessageDocument,
    code_background,
    colour_links,
    markdown_document,
    remember,
)
from app.chat.message_documents import shade_code as _shade_code  # tests patch it to count layouts
from app.chat.reasoning_blocks import make_room as make_reasoning_room
from app.chat.reasoning_blocks import paint as paint_reasoning
from app.chat.reasoning_blocks import reasoning_block
from app.chat.tool_blocks import add_calls
from app.chat.version_switcher import arrow_at, counter_text
from app.look.actions import spec
from app.look.theme import code_style

log = logging.getLogger(__name__)


def _text_key(row: MessageRow) -> int:
    """What a row's document depends on besides its node and width: its text, its calls,
    whether it began inside its reasoning, and the user's fold of its reasoning (None, the
    automatic one, follows from the text)."""
    if row.reasoning_shown is None and not row.reasoning_opened and not row.calls:
        return hash(row.text)
    return hash((row.text, row.reasoning_opened, row.reasoning_shown, row.calls))


def _height_key(row: MessageRow, item_width: int) -> tuple[int, int, int]:
    """What a row's height depends on: its document's key, the divider above it, the width."""
    shape = _text_key(row) if not row.context_starts else hash((_text_key(row), True))
    return (row.node_id, shape, item_width)


def _key_text(action: str) -> str:
    """The first shortcut of a chat action, as the platform writes it (for tooltips)."""
    keys = spec(action).keys
    return QKeySequence(keys[0]).toString(QKeySequence.SequenceFormat.NativeText) if keys else ""


class MessageDelegate(EditingDelegate):
    """Paints a message as a Markdown bubble with a role header and a version switcher.

    Each code block gets a strip above it with its language and, once the message is
    finished, a copy button: a click on it emits `code_copy_requested` (the view copies).

    It also makes the in-place `MessageEditor` for the one message being edited (see
    `EditingDelegate`): the row of that message grows to the editor's wanted height, its
    bubble takes the full width and its text is left to the editor, which sits over it.
    """

    variant_requested = Signal(int, int)  # node id, wanted variant index
    code_copy_requested = Signal(int, int)  # node id, index of the code block
    reasoning_toggle_requested = Signal(int)  # node id: its reasoning's header was clicked

    # The sizes, as their modules define them (changing these does not change the painting).
    MARGIN_H: ClassVar[int] = bubble.MARGIN_H  # outside the bubble, left and right
    MARGIN_V: ClassVar[int] = bubble.MARGIN_V  # outside the bubble, above and below
    PADDING: ClassVar[int] = bubble.PADDING  # inside the bubble
    HEADER_GAP: ClassVar[int] = bubble.HEADER_GAP  # between the header line and the text
    RADIUS: ClassVar[float] = bubble_painting.RADIUS
    USER_WIDTH: ClassVar[float] = bubble.USER_WIDTH  # user bubbles: at most this share
    MIN_USER_WIDTH: ClassVar[int] = bubble.MIN_USER_WIDTH
    ROLE_LABELS: ClassVar[dict[str, str]] = bubble.ROLE_LABELS
    STRIP_PAD: ClassVar[int] = code_strips.STRIP_PAD  # above and below the strip's label
    BUTTON_PAD: ClassVar[int] = code_strips.BUTTON_PAD  # left and right of the button's label
    COPY_LABELS: ClassVar[tuple[str, str]] = code_strips.COPY_LABELS  # before, after a copy

    def __init__(self, parent: QWidget | None = None, *, cache_limit: int = 512) -> None:
        super().__init__(parent)
        self.cache_limit = cache_limit
        self.height_cache_limit = max(cache_limit, 16384)
        self._docs: OrderedDict[tuple[int, int, int], MessageDocument] = OrderedDict()
        self._heights: OrderedDict[tuple[int, int, int], int] = OrderedDict()
        # (node id, width) -> the cache key of its latest text: a streaming reply's older
        # texts are dropped at once instead of crowding the LRU with dead documents.
        self._latest_doc: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._latest_height: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._token_formats: dict[tuple[str, int], TokenFormats] = {}
        self.hovered_button: tuple[int, int] | None = None  # (node id, code block index)
        self.copied_button: tuple[int, int] | None = None  # shows "Copied" for a moment

    # --- caches ------------------------------------------------------------------------

    def cache_size(self) -> int:
        """How many laid-out documents are cached (never more than `cache_limit`)."""
        return len(self._docs)

    def clear_cache(self) -> None:
        """Forget all laid-out documents and heights (after a font change)."""
        self._docs.clear()
        self._heights.clear()
        self._latest_doc.clear()
        self._latest_height.clear()

    def clear_documents(self) -> None:
        """Forget the laid-out documents but keep the heights (after a palette change).

        Documents carry colours (links), heights do not, so a theme switch re-lays out
        only the messages on screen instead of every row.
        """
        self._docs.clear()
        self._latest_doc.clear()

    def document(
        self, row: MessageRow, text_width: int, font: QFont | None = None
    ) -> MessageDocument:
        """The laid-out Markdown document for `row` at `text_width` pixels, from the cache.

        Its code blocks are found and given their strips here (the height does not change
        when the message finishes); they are coloured when it is painted finished.
        """
        key = (row.node_id, _text_key(row), text_width)
        doc = self._docs.get(key)
        if doc is not None:
            self._docs.move_to_end(key)
            return doc
        font = font if font is not None else self._font()
        split = reasoning_of(row)
        source = row.text if split is None else split.answer
        doc = markdown_document(source, font)
        _shade_code(doc)
        doc.code_blocks = find_code_blocks(doc, source)
        if doc.code_blocks:
            make_room(doc, doc.code_blocks, strip_height(font))
        palette = self._palette()
        add_calls(doc, row.calls, font, bubble_colours(palette, row.role).dim)
        if split is not None:
            doc.reasoning = reasoning_block(split.reasoning, reasoning_label(row, split),
                                            reasoning_shown(row, split), font, text_width,
                                            verbatim=row.role == TOOL or bool(row.documents))
            make_reasoning_room(doc, doc.reasoning)
        colour_links(doc, palette.color(QPalette.ColorRole.Link))
        doc.setTextWidth(text_width)
        remember(self._docs, self._latest_doc, key, doc, self.cache_limit)
        return doc

    def _item_height(self, row: MessageRow, item_width: int, font: QFont | None) -> int:
        """The height of `row`'s item in an item `item_width` wide, cached separately.

        `QListView` asks every row for its size on each relayout (every streamed token), so
        this is the hot path: a hit is one dict lookup and no Qt call.
        """
        key = _height_key(row, item_width)
        height = self._heights.get(key)
        if height is not None:
            self._heights.move_to_end(key)
            return height
        font = font if font is not None else self._font()
        doc = self.document(row, self.text_width(row.role, item_width), font)
        height = (self._frame_height(font) + divider_height(font, row)
                  + math.ceil(doc.size().height()))
        remember(self._heights, self._latest_height, key, height, self.height_cache_limit)
        return height

    def _highlight(self, doc: MessageDocument, palette: QPalette, fill: QColor) -> None:
        """Colour `doc`'s code blocks in the palette's style, readable on `fill`."""
        background = code_background(fill)
        key = (code_style(palette), background.rgba())
        formats = self._token_formats.get(key)
        if formats is None:
            formats = self._token_formats[key] = TokenFormats(key[0], background)
        coloured = highlight(doc, doc.code_blocks, formats)
        doc.highlighted = True
        log.debug("highlighted %d of %d code blocks in %s", coloured, len(doc.code_blocks),
                  formats.style_name)

    # --- geometry (app.chat.bubble_geometry, app.chat.code_strips, app.chat.version_switcher) ---

    def _font(self) -> QFont:
        parent = self.parent()
        return parent.font() if isinstance(parent, QWidget) else QApplication.font()

    def _palette(self) -> QPalette:
        parent = self.parent()
        return parent.palette() if isinstance(parent, QWidget) else QApplication.palette()

    def text_width(self, role: str, item_width: int) -> int:
        """The width the Markdown text is laid out at, for an item `item_width` wide."""
        return bubble.text_width(role, item_width)

    def _frame_height(self, font: QFont) -> int:
        """A bubble's height without its text: margins, padding and the header line."""
        return frame_height(font)

    def _counter_text(self, row: MessageRow) -> str:
        return counter_text(row)

    def _strip_height(self, font: QFont) -> int:
        """The height of the strip above a code block (its language and copy button)."""
        return strip_height(font)

    def _ideal_width(self, doc: MessageDocument, row: MessageRow, font: QFont) -> int | None:
        """How wide a user bubble's text wants to be (None for replies: they take the width);
        a code block's strip needs room for its language and its button."""
        if row.role != USER or row.documents:  # a message with documents: their width too
            return None
        return max(math.ceil(doc.idealWidth()), strips_width(doc.code_blocks, font))

    def _text_area(self, rect: QRect, row: MessageRow, font: QFont) -> QRect:
        """Where the text of `row`'s bubble, at its full width, goes in an item at `rect`."""
        return bubble_geometry(rect, row, font).text_area()

    def code_button_rects(self, option_rect: QRect, row: MessageRow) -> list[QRect]:
        """The copy buttons of `row`'s code blocks painted in `option_rect`, in order; none
        while it streams or is edited."""
        if row.status == STREAMING or self.editing_node == row.node_id:
            return []
        font = self._font()
        rect = QRect(option_rect)
        doc = self.document(row, self.text_width(row.role, rect.width()), font)
        if not doc.code_blocks:
            return []
        geometry = bubble_geometry(rect, row, font, self._ideal_width(doc, row, font))
        return button_rects(doc, geometry, font)

    def code_button_at(self, option_rect: QRect, row: MessageRow, pos: QPoint) -> int | None:
        """The index of the code block whose copy button is under `pos`, or None."""
        for number, rect in enumerate(self.code_button_rects(option_rect, row)):
            if rect.contains(pos):
                return number
        return None

    def reasoning_header_rect(self, option_rect: QRect, row: MessageRow) -> QRect:
        """The header of `row`'s reasoning (a click folds or unfolds it) painted in
        `option_rect`; an empty QRect when it has none or is being edited."""
        if reasoning_of(row) is None or self.editing_node == row.node_id:
            return QRect()
        font = self._font()
        rect = QRect(option_rect)
        doc = self.document(row, self.text_width(row.role, rect.width()), font)
        if doc.reasoning is None:
            return QRect()
        geometry = bubble_geometry(rect, row, font)
        header = doc.reasoning.header_rect(doc.textWidth())
        return header.translated(QPointF(geometry.text_origin)).toAlignedRect()

    def code_of(self, row: MessageRow, item_width: int) -> tuple[str, ...]:
        """The exact code of each of `row`'s code blocks, in order."""
        doc = self.document(row, self.text_width(row.role, item_width))
        return tuple(code.code for code in doc.code_blocks)

    def languages_of(self, row: MessageRow, item_width: int) -> tuple[str, ...]:
        """The language of each of `row`'s code blocks ("" where the fence names none)."""
        doc = self.document(row, self.text_width(row.role, item_width))
        return tuple(code.language for code in doc.code_blocks)

    def switcher_rects(self, option_rect: QRect, row: MessageRow) -> tuple[QRect, QRect]:
        """The (previous, next) arrow hit areas for `row` painted in `option_rect`.

        Both are empty QRects when the message has a single version. The arrows sit at the
        bubble's top right, which does not depend on the text, so no layout is needed.
        """
        switcher = bubble_geometry(QRect(option_rect), row, self._font()).switcher
        return switcher.left_arrow, switcher.right_arrow

    def arrow_at(self, option_rect: QRect, row: MessageRow, pos: QPoint) -> int:
        """-1 over an enabled "previous" arrow, +1 over an enabled "next" one, else 0."""
        if row.variants <= 1:
            return 0
        return arrow_at(bubble_geometry(QRect(option_rect), row, self._font()).switcher, row,
                        pos)

    # --- Qt's delegate interface -------------------------------------------------------

    @staticmethod
    def row_from_index(index: ModelIndex) -> MessageRow | None:
        """The `MessageRow` behind `index` (works through proxy models too)."""
        if not index.isValid():
            return None
        node_id = index.data(ChatRole.NodeIdRole)
        if node_id is None:
            return None
        return MessageRow(
            node_id=int(node_id),
            role=str(index.data(ChatRole.RoleRole)),
            text=str(index.data(ChatRole.TextRole) or ""),
            status=str(index.data(ChatRole.StatusRole) or COMPLETE),
            variant=int(index.data(ChatRole.VariantRole) or 0),
            variants=int(index.data(ChatRole.VariantsRole) or 1),
            checkpoint=index.data(ChatRole.CheckpointRole),
            call=str(index.data(ChatRole.CallRole) or ""),
            calls=tuple(index.data(ChatRole.CallsRole) or ()),
        )

    def _row(self, index: ModelIndex) -> MessageRow | None:
        """`row_from_index` with a fast path for a `ChatModel` (one call, not seven)."""
        model = index.model()
        if isinstance(model, ChatModel):
            rows = model._rows
            number = index.row()
            return rows[number] if 0 <= number < len(rows) else None
        return self.row_from_index(index)

    def _item_width(self, option: QStyleOptionViewItem) -> int:
        widget = option.widget
        if isinstance(widget, QAbstractItemView):
            return widget.viewport().width()
        if option.rect.width() > 0:
            return option.rect.width()
        return 600

    def sizeHint(self, option: QStyleOptionViewItem, index: ModelIndex) -> QSize:
        """Full item width; the height of header plus laid-out Markdown text."""
        row = self._row(index)
        if row is None:
            return super().sizeHint(option, index)
        width = self._item_width(option)
        if self._edit is not None and row.node_id == self._edit.node_id:
            return QSize(width, self._editing_height(option, self._edit.height))
        key = _height_key(row, width)
        height = self._heights.get(key)
        if height is None:
            height = self._item_height(row, width, QFont(option.font))
        else:
            self._heights.move_to_end(key)
        return QSize(width, height)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: ModelIndex) -> None:
        """Draw the bubble, its header (role, markers, switcher) and the Markdown text."""
        row = self._row(index)
        if row is None:
            super().paint(painter, option, index)
            return
        font = QFont(option.font)
        editing = self.editing_node == row.node_id
        text_width = self.text_width(row.role, option.rect.width())
        doc = None if editing else self.document(row, text_width, font)
        ideal = self._ideal_width(doc, row, font) if doc is not None else None
        geometry = bubble_geometry(option.rect, row, font, ideal)
        palette: QPalette = option.palette
        colours = bubble_colours(palette, row.role)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)

        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        if row.context_starts:
            paint_divider(painter, option.rect, geometry.bubble.top(), font, colours.dim)
        if row.outside:
            painter.setOpacity(OUTSIDE_OPACITY)  # the model no longer reads it
        paint_bubble(painter, geometry.bubble, palette, colours.fill, selected)
        paint_header(painter, geometry, row, font, palette, colours)
        if doc is None:  # being edited: the editor shows the text
            painter.restore()
            return

        if doc.code_blocks and not doc.highlighted and row.status != STREAMING:
            self._highlight(doc, palette, colours.fill)  # once: the message is finished

        visible = QRectF(option.rect)
        if isinstance(option.widget, QAbstractItemView):
            # Only the part of a tall message that is on screen needs drawing.
            visible = visible.intersected(QRectF(option.widget.viewport().rect()))
        paint_text(painter, doc, geometry, palette, colours.text, visible)
        if doc.code_blocks:
            paint_code_strips(painter, doc, row, font, geometry, colours, self.hovered_button,
                              self.copied_button)
        if doc.reasoning is not None:
            paint_reasoning(painter, doc.reasoning, font, doc.textWidth(), colours.dim,
                            colours.text)
        painter.restore()

    def helpEvent(
        self,
        event: QHelpEvent,
        view: QAbstractItemView,
        option: QStyleOptionViewItem,
        index: ModelIndex,
    ) -> bool:
        """Tooltips on the painted controls name them and their keys; elsewhere, the
        message's time (the model's tooltip)."""
        row = self._row(index)
        if row is not None and event.type() == QEvent.Type.ToolTip:
            pos = event.pos()
            tip = ""
            previous, following = self.switcher_rects(option.rect, row)
            if self.code_button_at(option.rect, row, pos) is not None:
                tip = f"Copy the code ({_key_text('copy_code')})"
            elif self.reasoning_header_rect(option.rect, row).contains(pos):
                split = reasoning_of(row)
                verb = "Hide" if split is not None and reasoning_shown(row, split) else "Show"
                what = "result" if row.role == TOOL else "reasoning"
                tip = f"{verb} the {what} ({_key_text('toggle_reasoning')})"
            elif previous.contains(pos):  # enabled or not: the tip says what it is for
                tip = f"Previous version ({_key_text('previous_variant')})"
            elif following.contains(pos):
                tip = f"Next version ({_key_text('next_variant')})"
            if tip:
                QToolTip.showText(event.globalPos(), tip, view)
                return True
        return super().helpEvent(event, view, option, index)

    def editorEvent(
        self,
        event: QEvent,
        model: QAbstractItemModel,
        option: QStyleOptionViewItem,
        index: ModelIndex,
    ) -> bool:
        """Clicks on a copy button emit `code_copy_requested`, on the reasoning's header
        `reasoning_toggle_requested`, on the switcher arrows `variant_requested`; other events
        pass on."""
        kind = event.type()
        if kind not in (
            QEvent.Type.MouseButtonPress,
            QEvent.Type.MouseButtonRelease,
            QEvent.Type.MouseButtonDblClick,
        ) or not isinstance(event, QMouseEvent):
            return super().editorEvent(event, model, option, index)
        if event.button() != Qt.MouseButton.LeftButton:
            return super().editorEvent(event, model, option, index)
        row = self._row(index)
        if row is None:
            return False
        pos = event.position().toPoint()
        button = self.code_button_at(option.rect, row, pos)
        if button is not None:
            if kind == QEvent.Type.MouseButtonRelease:
                log.debug("copy code block %s of node %s", button, row.node_id)
                self.code_copy_requested.emit(row.node_id, button)
            return True
        if self.reasoning_header_rect(option.rect, row).contains(pos):
            if kind == QEvent.Type.MouseButtonRelease:
                log.debug("toggle the reasoning of node %s", row.node_id)
                self.reasoning_toggle_requested.emit(row.node_id)
            return True
        direction = self.arrow_at(option.rect, row, pos)
        if direction == 0:
            return super().editorEvent(event, model, option, index)
        if kind == QEvent.Type.MouseButtonRelease:
            log.debug("switch node %s to variant %s", row.node_id, row.variant + direction)
            self.variant_requested.emit(row.node_id, row.variant + direction)
        return True
