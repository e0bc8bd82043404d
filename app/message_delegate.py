"""The chat view's delegate: each message painted as a bubble with Markdown text.

`MessageDelegate` paints each row as a bubble with Markdown text: a role header with the
`< n/m >` version switcher, and over each fenced code block a strip with its language and a copy
button (the blocks: app.code_blocks; coloured once a message is painted finished, never while
it streams), and above a reply's answer its reasoning as a disclosure that a click folds or
unfolds (app.reasoning_blocks). Laid-out documents live in a bounded LRU cache keyed by (node
id, hash of the text and the reasoning's fold, width), shared by `sizeHint` and `paint`; row
heights have their own (much larger, tiny-entry) cache because `QListView` asks every row for
its size on each relayout, which would otherwise thrash the document cache on long
conversations. The documents are finished and cached with the helpers of app.message_documents;
the in-place `MessageEditor` for the one message being edited is hosted by the base class,
`EditingDelegate` (app.editing_delegate).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
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
    QAbstractTextDocumentLayout,
    QColor,
    QFont,
    QFontMetrics,
    QHelpEvent,
    QKeySequence,
    QMouseEvent,
    QPainter,
    QPalette,
    QPen,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QStyle,
    QStyleOptionViewItem,
    QToolTip,
    QWidget,
)

from app.actions import spec
from app.chat_model import (
    ASSISTANT,
    COMPLETE,
    INTERRUPTED,
    STREAMING,
    USER,
    ChatModel,
    ChatRole,
    MessageRow,
    ModelIndex,
    reasoning_label,
    reasoning_of,
    reasoning_shown,
)
from app.code_blocks import (
    TokenFormats,
    find_code_blocks,
    highlight,
    label_font,
    make_room,
    strip_rect,
)
from app.editing_delegate import EditingDelegate
from app.message_documents import (
    CODE_BACKGROUND,
    MessageDocument,
    code_background,
    colour_links,
    markdown_document,
    mix,
    remember,
)
from app.message_documents import shade_code as _shade_code  # tests patch it to count layouts
from app.reasoning_blocks import make_room as make_reasoning_room
from app.reasoning_blocks import paint as paint_reasoning
from app.reasoning_blocks import reasoning_block
from app.theme import code_style

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Geometry:
    bubble: QRect
    header: QRect
    text_origin: QPoint
    left_arrow: QRect
    counter: QRect
    right_arrow: QRect


def _text_key(row: MessageRow) -> int:
    """What a row's document depends on besides its node and width: its text, and the
    user's fold of its reasoning (None, the automatic one, follows from the text)."""
    if row.reasoning_shown is None:
        return hash(row.text)
    return hash((row.text, row.reasoning_shown))


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

    MARGIN_H: ClassVar[int] = 12  # outside the bubble, left and right
    MARGIN_V: ClassVar[int] = 5  # outside the bubble, above and below
    PADDING: ClassVar[int] = 10  # inside the bubble
    HEADER_GAP: ClassVar[int] = 4  # between the header line and the text
    RADIUS: ClassVar[float] = 9.0
    USER_WIDTH: ClassVar[float] = 0.8  # user bubbles are at most this share of the width
    MIN_USER_WIDTH: ClassVar[int] = 260
    ROLE_LABELS: ClassVar[dict[str, str]] = {USER: "You", ASSISTANT: "Assistant"}
    STRIP_PAD: ClassVar[int] = 5  # above and below the strip's label
    BUTTON_PAD: ClassVar[int] = 8  # left and right of the copy button's label
    COPY_LABELS: ClassVar[tuple[str, str]] = ("Copy", "Copied")  # before, just after a copy

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
            make_room(doc, doc.code_blocks, self._strip_height(font))
        if split is not None:
            doc.reasoning = reasoning_block(split.reasoning, reasoning_label(row, split),
                                            reasoning_shown(row, split), font, text_width)
            make_reasoning_room(doc, doc.reasoning)
        colour_links(doc, self._palette().color(QPalette.ColorRole.Link))
        doc.setTextWidth(text_width)
        remember(self._docs, self._latest_doc, key, doc, self.cache_limit)
        return doc

    def _item_height(self, row: MessageRow, item_width: int, font: QFont | None) -> int:
        """The height of `row`'s item in an item `item_width` wide, cached separately.

        `QListView` asks every row for its size on each relayout (every streamed token), so
        this is the hot path: a hit is one dict lookup and no Qt call.
        """
        key = (row.node_id, _text_key(row), item_width)
        height = self._heights.get(key)
        if height is not None:
            self._heights.move_to_end(key)
            return height
        font = font if font is not None else self._font()
        doc = self.document(row, self.text_width(row.role, item_width), font)
        height = self._frame_height(font) + math.ceil(doc.size().height())
        remember(self._heights, self._latest_height, key, height, self.height_cache_limit)
        return height

    # --- geometry ----------------------------------------------------------------------

    def _font(self) -> QFont:
        parent = self.parent()
        return parent.font() if isinstance(parent, QWidget) else QApplication.font()

    def _palette(self) -> QPalette:
        parent = self.parent()
        return parent.palette() if isinstance(parent, QWidget) else QApplication.palette()

    def _available(self, width: int) -> int:
        """Widest a bubble can be in an item `width` pixels wide."""
        return max(2 * self.PADDING + 40, width - 2 * self.MARGIN_H)

    def _max_bubble(self, role: str, width: int) -> int:
        available = self._available(width)
        if role == USER:
            return min(available, max(int(available * self.USER_WIDTH), self.MIN_USER_WIDTH))
        return available

    def text_width(self, role: str, item_width: int) -> int:
        """The width the Markdown text is laid out at, for an item `item_width` wide."""
        return self._max_bubble(role, item_width) - 2 * self.PADDING

    @staticmethod
    def _header_height(metrics: QFontMetrics) -> int:
        return metrics.height() + 2

    def _frame_height(self, font: QFont) -> int:
        """A bubble's height without its text: margins, padding and the header line."""
        header_h = self._header_height(QFontMetrics(font))
        return 2 * self.MARGIN_V + 2 * self.PADDING + header_h + self.HEADER_GAP

    def _markers(self, row: MessageRow) -> str:
        parts: list[str] = []
        if row.status == STREAMING:
            parts.append("…")
        elif row.status == INTERRUPTED:
            parts.append("· interrupted")
        if row.checkpoint:
            parts.append(f"· ⚑ {row.checkpoint}")
        return " ".join(parts)

    def _counter_text(self, row: MessageRow) -> str:
        return f"{row.variant + 1}/{row.variants}"

    def _geometry(
        self, rect: QRect, row: MessageRow, font: QFont, ideal_width: int | None = None
    ) -> _Geometry:
        metrics = QFontMetrics(font)
        bold = QFont(font)
        bold.setBold(True)
        header_h = self._header_height(metrics)
        arrow = header_h
        counter_w = metrics.horizontalAdvance(f"{row.variants}/{row.variants}") + 6
        switcher_w = 2 * arrow + counter_w if row.variants > 1 else 0
        max_bubble = self._max_bubble(row.role, rect.width())
        if row.role == USER and ideal_width is not None:
            header_w = QFontMetrics(bold).horizontalAdvance(
                self.ROLE_LABELS.get(row.role, row.role)
            )
            markers = self._markers(row)
            if markers:
                header_w += metrics.horizontalAdvance(" " + markers)
            if switcher_w:
                header_w += 12 + switcher_w
            width = min(max_bubble, max(ideal_width, header_w) + 2 * self.PADDING)
        else:
            width = max_bubble
        top = rect.top() + self.MARGIN_V
        height = rect.height() - 2 * self.MARGIN_V
        right = rect.right() - self.MARGIN_H
        left = right - width + 1 if row.role == USER else rect.left() + self.MARGIN_H
        bubble = QRect(left, top, width, height)
        header = QRect(left + self.PADDING, top + self.PADDING, width - 2 * self.PADDING, header_h)
        text_origin = QPoint(left + self.PADDING, header.bottom() + 1 + self.HEADER_GAP)
        if switcher_w:
            bubble_right = bubble.right() - self.PADDING + 1
            right_arrow = QRect(bubble_right - arrow, header.top(), arrow, arrow)
            counter = QRect(right_arrow.left() - counter_w, header.top(), counter_w, arrow)
            left_arrow = QRect(counter.left() - arrow, header.top(), arrow, arrow)
        else:
            right_arrow = counter = left_arrow = QRect()
        return _Geometry(bubble, header, text_origin, left_arrow, counter, right_arrow)

    # --- code blocks ---------------------------------------------------------------------

    def _strip_height(self, font: QFont) -> int:
        """The height of the strip above a code block (its language and copy button)."""
        return QFontMetrics(label_font(font)).height() + 2 * self.STRIP_PAD

    def _button_width(self, font: QFont) -> int:
        metrics = QFontMetrics(label_font(font))
        return max(metrics.horizontalAdvance(t) for t in self.COPY_LABELS) + 2 * self.BUTTON_PAD

    def _ideal_width(self, doc: MessageDocument, row: MessageRow, font: QFont) -> int | None:
        """How wide a user bubble's text wants to be (None for replies: they take the width);
        a code block's strip needs room for its language and its button."""
        if row.role != USER:
            return None
        ideal = math.ceil(doc.idealWidth())
        if doc.code_blocks:
            metrics = QFontMetrics(label_font(font))
            language = max(metrics.horizontalAdvance(c.language) for c in doc.code_blocks)
            ideal = max(ideal, language + self._button_width(font) + 3 * self.STRIP_PAD)
        return ideal

    def _code_widths(self, doc: MessageDocument, geometry: _Geometry) -> tuple[float, float]:
        """How wide a code strip's background is (as wide as the code lines' background,
        which a narrow user bubble cuts at its edge) and how far its controls reach (the
        text's right edge)."""
        inner = geometry.bubble.width() - self.PADDING
        return min(doc.textWidth(), inner), min(doc.textWidth(), inner - self.PADDING)

    def _button_in_strip(self, strip: QRectF, font: QFont) -> QRectF:
        inset = 2.0
        width = self._button_width(font)
        return QRectF(strip.right() - width - inset, strip.top() + inset, width,
                      strip.height() - 2 * inset)

    def code_button_rects(self, option_rect: QRect, row: MessageRow) -> list[QRect]:
        """The copy buttons of `row`'s code blocks painted in `option_rect`, in order; none
        while it streams or is edited."""
        if row.status == STREAMING or (self._edit is not None
                                       and row.node_id == self._edit.node_id):
            return []
        font = self._font()
        rect = QRect(option_rect)
        doc = self.document(row, self.text_width(row.role, rect.width()), font)
        if not doc.code_blocks:
            return []
        geometry = self._geometry(rect, row, font, self._ideal_width(doc, row, font))
        _background, width = self._code_widths(doc, geometry)
        height = self._strip_height(font)
        origin = QPointF(geometry.text_origin)
        return [
            self._button_in_strip(strip_rect(doc, code, height, width), font)
            .translated(origin).toAlignedRect()
            for code in doc.code_blocks
        ]

    def code_button_at(self, option_rect: QRect, row: MessageRow, pos: QPoint) -> int | None:
        """The index of the code block whose copy button is under `pos`, or None."""
        for number, rect in enumerate(self.code_button_rects(option_rect, row)):
            if rect.contains(pos):
                return number
        return None

    def reasoning_header_rect(self, option_rect: QRect, row: MessageRow) -> QRect:
        """The header of `row`'s reasoning (a click folds or unfolds it) painted in
        `option_rect`; an empty QRect when it has none or is being edited."""
        if reasoning_of(row) is None or (self._edit is not None
                                         and row.node_id == self._edit.node_id):
            return QRect()
        font = self._font()
        rect = QRect(option_rect)
        doc = self.document(row, self.text_width(row.role, rect.width()), font)
        if doc.reasoning is None:
            return QRect()
        geometry = self._geometry(rect, row, font)
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

    def _paint_code_strips(
        self,
        painter: QPainter,
        doc: MessageDocument,
        row: MessageRow,
        font: QFont,
        widths: tuple[float, float],
        colours: tuple[QColor, QColor, QColor],
    ) -> None:
        """Each code block's strip (in document coordinates): its language, and its copy
        button once the message is finished (hovered: filled; just used: "Copied")."""
        text, dim, fill = colours
        small = label_font(font)
        painter.setFont(small)
        height = self._strip_height(font)
        align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        for number, code in enumerate(doc.code_blocks):
            strip = strip_rect(doc, code, height, widths[1])
            painter.fillRect(strip_rect(doc, code, height, widths[0]), CODE_BACKGROUND)
            if code.language:
                painter.setPen(dim)
                painter.drawText(strip.adjusted(self.STRIP_PAD + 1, 0, 0, 0), align,
                                 code.language)
            if row.status == STREAMING:
                continue
            button = self._button_in_strip(strip, font)
            hovered = self.hovered_button == (row.node_id, number)
            copied = self.copied_button == (row.node_id, number)
            painter.setPen(QPen(text if hovered else dim, 1.0))
            painter.setBrush(mix(fill, text, 0.18) if hovered else Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(button.adjusted(0.5, 0.5, -0.5, -0.5), 4.0, 4.0)
            painter.setPen(text if hovered or copied else dim)
            painter.drawText(button, Qt.AlignmentFlag.AlignCenter,
                             self.COPY_LABELS[1 if copied else 0])

    def _text_area(self, rect: QRect, row: MessageRow, font: QFont) -> QRect:
        """Where the text of `row`'s bubble, at its full width, goes in an item at `rect`."""
        geometry = self._geometry(rect, row, font)
        bubble = geometry.bubble
        bottom_right = QPoint(bubble.right() - self.PADDING, bubble.bottom() - self.PADDING)
        return QRect(geometry.text_origin, bottom_right)

    def switcher_rects(self, option_rect: QRect, row: MessageRow) -> tuple[QRect, QRect]:
        """The (previous, next) arrow hit areas for `row` painted in `option_rect`.

        Both are empty QRects when the message has a single version. The arrows sit at the
        bubble's top right, which does not depend on the text, so no layout is needed.
        """
        geometry = self._geometry(QRect(option_rect), row, self._font())
        return geometry.left_arrow, geometry.right_arrow

    def arrow_at(self, option_rect: QRect, row: MessageRow, pos: QPoint) -> int:
        """-1 over an enabled "previous" arrow, +1 over an enabled "next" one, else 0."""
        if row.variants <= 1:
            return 0
        left, right = self.switcher_rects(option_rect, row)
        if left.contains(pos) and row.variant > 0:
            return -1
        if right.contains(pos) and row.variant + 1 < row.variants:
            return 1
        return 0

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
        key = (row.node_id, _text_key(row), width)
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
        editing = self._edit is not None and row.node_id == self._edit.node_id
        text_width = self.text_width(row.role, option.rect.width())
        doc = None if editing else self.document(row, text_width, font)
        ideal = self._ideal_width(doc, row, font) if doc is not None else None
        geometry = self._geometry(option.rect, row, font, ideal)
        palette: QPalette = option.palette
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        if row.role == USER:
            fill = mix(base, palette.color(QPalette.ColorRole.Highlight), 0.22)
        else:
            fill = mix(base, text, 0.06)
        dim = mix(text, fill, 0.45)
        state = option.state
        selected = bool(state & QStyle.StateFlag.State_Selected)

        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        if selected:
            painter.setPen(QPen(palette.color(QPalette.ColorRole.Highlight), 1.5))
        else:
            painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(fill)
        painter.drawRoundedRect(
            QRectF(geometry.bubble).adjusted(0.5, 0.5, -0.5, -0.5), self.RADIUS, self.RADIUS
        )

        # Header: role name in bold, then markers, then the switcher at the right.
        header = geometry.header
        bold = QFont(font)
        bold.setBold(True)
        label = self.ROLE_LABELS.get(row.role, row.role)
        painter.setFont(bold)
        painter.setPen(text)
        label_w = QFontMetrics(bold).horizontalAdvance(label)
        align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        painter.drawText(header, align, label)
        markers = self._markers(row)
        if markers:
            painter.setFont(font)
            marker_rect = QRect(header)
            marker_rect.setLeft(header.left() + label_w + QFontMetrics(font).horizontalAdvance(" "))
            if row.variants > 1:
                marker_rect.setRight(geometry.left_arrow.left() - 4)
            if row.status == INTERRUPTED:
                painter.setPen(
                    mix(palette.color(QPalette.ColorRole.Text), QColor(220, 60, 40), 0.7)
                )
            else:
                painter.setPen(dim)
            elided = QFontMetrics(font).elidedText(
                markers, Qt.TextElideMode.ElideRight, max(0, marker_rect.width())
            )
            painter.drawText(marker_rect, align, elided)
        if row.variants > 1:
            self._paint_switcher(painter, geometry, row, font, text, dim)
        if doc is None:  # being edited: the editor shows the text
            painter.restore()
            return

        if doc.code_blocks and not doc.highlighted and row.status != STREAMING:
            self._highlight(doc, palette, fill)  # once: the message is finished

        # The text, in the bubble's colours.
        painter.translate(geometry.text_origin)
        context = QAbstractTextDocumentLayout.PaintContext()
        text_palette = QPalette(palette)
        text_palette.setColor(QPalette.ColorRole.Text, text)
        context.palette = text_palette
        visible = QRectF(option.rect)
        if isinstance(option.widget, QAbstractItemView):
            # Only the part of a tall message that is on screen needs drawing.
            visible = visible.intersected(QRectF(option.widget.viewport().rect()))
        context.clip = visible.translated(-QPointF(geometry.text_origin))
        # Wide content (a table) is cut at the bubble's edge instead of overflowing it.
        painter.setClipRect(
            QRectF(geometry.bubble).translated(-QPointF(geometry.text_origin)),
            Qt.ClipOperation.IntersectClip,
        )
        doc.documentLayout().draw(painter, context)
        if doc.code_blocks:
            self._paint_code_strips(painter, doc, row, font, self._code_widths(doc, geometry),
                                    (text, dim, fill))
        if doc.reasoning is not None:
            paint_reasoning(painter, doc.reasoning, font, doc.textWidth(), dim)
        painter.restore()

    def _paint_switcher(
        self,
        painter: QPainter,
        geometry: _Geometry,
        row: MessageRow,
        font: QFont,
        enabled: QColor,
        disabled: QColor,
    ) -> None:
        painter.setFont(font)
        painter.setPen(enabled)
        painter.drawText(geometry.counter, Qt.AlignmentFlag.AlignCenter, self._counter_text(row))
        for rect, direction, active in (
            (geometry.left_arrow, -1, row.variant > 0),
            (geometry.right_arrow, 1, row.variant + 1 < row.variants),
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
                tip = f"{verb} the reasoning ({_key_text('toggle_reasoning')})"
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
