"""The chat view: the active path of a conversation tree as a list of message bubbles.

Model/view with no widget per message, so conversations of thousands of messages scroll
smoothly:

* `ChatModel` holds immutable `MessageRow` snapshots (built with `rows_from_tree`) and never
  touches a live `Tree`, so the tree may belong to another thread. `set_rows` diffs the new
  snapshot against the old one and emits the smallest change (dataChanged / a removed tail /
  an inserted tail); `update_text` grows a streaming reply in place.
* `MessageDelegate` paints each row as a bubble with Markdown text. Laid-out documents live
  in a bounded LRU cache keyed by (node id, text hash, width), shared by `sizeHint` and
  `paint`; row heights have their own (much larger, tiny-entry) cache because `QListView`
  asks every row for its size on each relayout, which would otherwise thrash the document
  cache on long conversations.
* `ChatView` is the `QListView` with the per-message actions (edit, regenerate, rewind,
  fork, copy, delete, previous/next version), each reported as a signal with the node id.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

from PySide6.QtCore import (
    QAbstractItemModel,
    QAbstractListModel,
    QByteArray,
    QEvent,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QPoint,
    QPointF,
    QRect,
    QRectF,
    QSize,
    Qt,
    Signal,
    Slot,
)
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QAction,
    QColor,
    QContextMenuEvent,
    QFont,
    QFontMetrics,
    QGuiApplication,
    QKeyEvent,
    QKeySequence,
    QMouseEvent,
    QPainter,
    QPalette,
    QPen,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextOption,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QListView,
    QMenu,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QWidget,
)

from engine.tree import Tree

log = logging.getLogger(__name__)

ModelIndex = QModelIndex | QPersistentModelIndex

USER = "user"
ASSISTANT = "assistant"
COMPLETE = "complete"
STREAMING = "streaming"
INTERRUPTED = "interrupted"


# --- the rows ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MessageRow:
    """An immutable snapshot of one message of the active path."""

    node_id: int
    role: str  # "user" | "assistant"
    text: str
    status: str  # "complete" | "streaming" | "interrupted"
    variant: int  # 0-based index among its siblings
    variants: int  # number of siblings, itself included
    checkpoint: str | None = None


def rows_from_tree(tree: Tree, checkpoints: Mapping[int, str] | None = None) -> list[MessageRow]:
    """Snapshot the tree's active path (system root excluded) as rows for `ChatModel`.

    `checkpoints` maps node ids to a checkpoint label shown on that message. Call this on the
    thread that owns the tree and hand the (immutable) result to the GUI thread.
    """
    rows: list[MessageRow] = []
    marks = checkpoints or {}
    for node in tree.messages():
        siblings = tree.siblings(node.id)
        rows.append(
            MessageRow(
                node_id=node.id,
                role=str(node.role.value),
                text=node.text,
                status=str(node.status.value),
                variant=siblings.index(node.id),
                variants=len(siblings),
                checkpoint=marks.get(node.id),
            )
        )
    return rows


# --- the model ---------------------------------------------------------------------------


class ChatRole(IntEnum):
    """The model's custom item data roles."""

    NodeIdRole = Qt.ItemDataRole.UserRole + 1
    RoleRole = Qt.ItemDataRole.UserRole + 2
    TextRole = Qt.ItemDataRole.UserRole + 3
    StatusRole = Qt.ItemDataRole.UserRole + 4
    VariantRole = Qt.ItemDataRole.UserRole + 5
    VariantsRole = Qt.ItemDataRole.UserRole + 6
    CheckpointRole = Qt.ItemDataRole.UserRole + 7


_ROLE_FIELDS: dict[int, str] = {
    ChatRole.NodeIdRole: "node_id",
    ChatRole.RoleRole: "role",
    ChatRole.TextRole: "text",
    ChatRole.StatusRole: "status",
    ChatRole.VariantRole: "variant",
    ChatRole.VariantsRole: "variants",
    ChatRole.CheckpointRole: "checkpoint",
}

_ROLE_NAMES: dict[int, bytes] = {
    ChatRole.NodeIdRole: b"nodeId",
    ChatRole.RoleRole: b"role",
    ChatRole.TextRole: b"text",
    ChatRole.StatusRole: b"status",
    ChatRole.VariantRole: b"variant",
    ChatRole.VariantsRole: b"variants",
    ChatRole.CheckpointRole: b"checkpoint",
}

_DISPLAY = int(Qt.ItemDataRole.DisplayRole)
_ACCESSIBLE = int(Qt.ItemDataRole.AccessibleTextRole)


def _changed_roles(old: MessageRow, new: MessageRow) -> list[int]:
    roles = [
        role for role, name in _ROLE_FIELDS.items() if getattr(old, name) != getattr(new, name)
    ]
    if old.text != new.text:
        roles += [_DISPLAY, _ACCESSIBLE]
    elif old.role != new.role:
        roles.append(_ACCESSIBLE)
    return roles


class ChatModel(QAbstractListModel):
    """One row per message of the active path, fed with immutable `MessageRow` snapshots."""

    Roles = ChatRole

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._rows: list[MessageRow] = []
        self._index: dict[int, int] = {}

    # --- Qt's model interface ----------------------------------------------------------

    def rowCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        """The number of messages; items have no children."""
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: ModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        """The row's field for a `ChatRole`, its text for DisplayRole, None otherwise."""
        if not index.isValid() or index.column() != 0 or not 0 <= index.row() < len(self._rows):
            return None
        row = self._rows[index.row()]
        role = int(role)
        if role == _DISPLAY:
            return row.text
        if role == _ACCESSIBLE:
            return f"{row.role}: {row.text}"
        name = _ROLE_FIELDS.get(role)
        return None if name is None else getattr(row, name)

    def flags(self, index: ModelIndex) -> Qt.ItemFlag:
        """Messages are selectable, enabled, never editable in place, never parents."""
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return (
            Qt.ItemFlag.ItemIsEnabled
            | Qt.ItemFlag.ItemIsSelectable
            | Qt.ItemFlag.ItemNeverHasChildren
        )

    def roleNames(self) -> dict[int, QByteArray]:
        """Qt's default role names plus the `ChatRole` ones (for QML or debugging)."""
        names = dict(super().roleNames())
        names.update({role: QByteArray(name) for role, name in _ROLE_NAMES.items()})
        return names

    # --- Arbor's interface -------------------------------------------------------------

    def rows(self) -> list[MessageRow]:
        """A copy of the current rows."""
        return list(self._rows)

    def row_at(self, row: int) -> MessageRow:
        """The snapshot shown at `row` (IndexError when out of range)."""
        if not 0 <= row < len(self._rows):
            raise IndexError(f"row {row} out of range (the model has {len(self._rows)} rows)")
        return self._rows[row]

    def row_of(self, node_id: int) -> int | None:
        """The row showing `node_id`, or None when it is not on the shown path."""
        return self._index.get(node_id)

    def set_rows(self, rows: Sequence[MessageRow]) -> None:
        """Show `rows`, emitting the smallest change against what is shown now.

        Rows are matched by node id from the top: the common prefix keeps its rows (each one
        whose fields changed gets a dataChanged with the changed roles), the old tail after it
        is removed and the new tail inserted. A full reset happens only when nothing is
        shared (another conversation), since then one reset is cheaper than two big moves.
        """
        new = list(rows)
        old = self._rows
        shared = min(len(old), len(new))
        prefix = 0
        while prefix < shared and old[prefix].node_id == new[prefix].node_id:
            prefix += 1
        if prefix == 0 and old and new:
            self.beginResetModel()
            self._rows = new
            self._reindex()
            self.endResetModel()
            return
        changes: list[tuple[int, list[int]]] = []
        for i in range(prefix):
            if old[i] is not new[i] and old[i] != new[i]:
                changes.append((i, _changed_roles(old[i], new[i])))
                old[i] = new[i]
        self._emit_changes(changes)
        if prefix < len(old):
            self.beginRemoveRows(QModelIndex(), prefix, len(old) - 1)
            for gone in old[prefix:]:
                self._index.pop(gone.node_id, None)
            del old[prefix:]
            self.endRemoveRows()
        if prefix < len(new):
            self.beginInsertRows(QModelIndex(), prefix, len(new) - 1)
            for i in range(prefix, len(new)):
                old.append(new[i])
                self._index[new[i].node_id] = i
            self.endInsertRows()

    def update_text(self, node_id: int, text: str, status: str = STREAMING) -> bool:
        """Replace one message's text and status (a streaming reply growing).

        Emits dataChanged for that row only, with the roles that changed. Returns False (and
        changes nothing) when the node is not shown.
        """
        row = self._index.get(node_id)
        if row is None:
            log.debug("update_text for node %s, which is not shown", node_id)
            return False
        old = self._rows[row]
        if old.text == text and old.status == status:
            return True
        new = MessageRow(
            node_id=old.node_id,
            role=old.role,
            text=text,
            status=str(status),
            variant=old.variant,
            variants=old.variants,
            checkpoint=old.checkpoint,
        )
        self._rows[row] = new
        self._emit_changes([(row, _changed_roles(old, new))])
        return True

    def clear(self) -> None:
        """Show nothing."""
        self.set_rows([])

    def _emit_changes(self, changes: list[tuple[int, list[int]]]) -> None:
        """dataChanged per run of consecutive changed rows, with the union of their roles."""
        start = 0
        while start < len(changes):
            end = start
            roles = set(changes[start][1])
            while end + 1 < len(changes) and changes[end + 1][0] == changes[end][0] + 1:
                end += 1
                roles.update(changes[end][1])
            top = self.index(changes[start][0], 0)
            bottom = self.index(changes[end][0], 0)
            self.dataChanged.emit(top, bottom, sorted(roles))
            start = end + 1

    def _reindex(self) -> None:
        self._index = {row.node_id: i for i, row in enumerate(self._rows)}


# --- the delegate ------------------------------------------------------------------------


def _mix(a: QColor, b: QColor, amount: float) -> QColor:
    """`a` moved `amount` (0..1) of the way towards `b`; works the same on light and dark."""
    return QColor.fromRgbF(
        a.redF() + (b.redF() - a.redF()) * amount,
        a.greenF() + (b.greenF() - a.greenF()) * amount,
        a.blueF() + (b.blueF() - a.blueF()) * amount,
        1.0,
    )


# Translucent grey reads on both light and dark bubbles, so no palette goes into the cache.
_CODE_BACKGROUND = QColor(128, 128, 128, 48)


def _shade_code(doc: QTextDocument) -> None:
    """Give fenced code blocks and inline code a faint background (the importer only sets
    the monospace font)."""
    cursor = QTextCursor(doc)
    block = doc.begin()
    while block.isValid():
        fmt = block.blockFormat()
        if fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines():
            fmt.setBackground(_CODE_BACKGROUND)
            # Wrap long code lines rather than paint past the bubble (no sideways scrolling).
            fmt.setNonBreakableLines(False)
            cursor.setPosition(block.position())
            cursor.setBlockFormat(fmt)
        else:
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                if fragment.isValid() and fragment.charFormat().fontFixedPitch():
                    shade = QTextCharFormat()
                    shade.setBackground(_CODE_BACKGROUND)
                    cursor.setPosition(fragment.position())
                    cursor.setPosition(
                        fragment.position() + fragment.length(), QTextCursor.MoveMode.KeepAnchor
                    )
                    cursor.mergeCharFormat(shade)
                it += 1
        block = block.next()


def _remember(
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


@dataclass(frozen=True)
class _Geometry:
    bubble: QRect
    header: QRect
    text_origin: QPoint
    left_arrow: QRect
    counter: QRect
    right_arrow: QRect


class MessageDelegate(QStyledItemDelegate):
    """Paints a message as a Markdown bubble with a role header and a version switcher."""

    variant_requested = Signal(int, int)  # node id, wanted variant index

    MARGIN_H: ClassVar[int] = 12  # outside the bubble, left and right
    MARGIN_V: ClassVar[int] = 5  # outside the bubble, above and below
    PADDING: ClassVar[int] = 10  # inside the bubble
    HEADER_GAP: ClassVar[int] = 4  # between the header line and the text
    RADIUS: ClassVar[float] = 9.0
    USER_WIDTH: ClassVar[float] = 0.8  # user bubbles are at most this share of the width
    MIN_USER_WIDTH: ClassVar[int] = 260
    ROLE_LABELS: ClassVar[dict[str, str]] = {USER: "You", ASSISTANT: "Assistant"}

    def __init__(self, parent: QWidget | None = None, *, cache_limit: int = 512) -> None:
        super().__init__(parent)
        self.cache_limit = cache_limit
        self.height_cache_limit = max(cache_limit, 16384)
        self._docs: OrderedDict[tuple[int, int, int], QTextDocument] = OrderedDict()
        self._heights: OrderedDict[tuple[int, int, int], int] = OrderedDict()
        # (node id, width) -> the cache key of its latest text: a streaming reply's older
        # texts are dropped at once instead of crowding the LRU with dead documents.
        self._latest_doc: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._latest_height: dict[tuple[int, int], tuple[int, int, int]] = {}

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

    def document(
        self, row: MessageRow, text_width: int, font: QFont | None = None
    ) -> QTextDocument:
        """The laid-out Markdown document for `row` at `text_width` pixels, from the cache."""
        key = (row.node_id, hash(row.text), text_width)
        doc = self._docs.get(key)
        if doc is not None:
            self._docs.move_to_end(key)
            return doc
        doc = QTextDocument()
        doc.setUndoRedoEnabled(False)
        doc.setDocumentMargin(0)
        doc.setDefaultFont(font if font is not None else self._font())
        option = doc.defaultTextOption()
        option.setWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)  # long URLs too
        doc.setDefaultTextOption(option)
        doc.setMarkdown(row.text)
        _shade_code(doc)
        doc.setTextWidth(text_width)
        _remember(self._docs, self._latest_doc, key, doc, self.cache_limit)
        return doc

    def _item_height(self, row: MessageRow, item_width: int, font: QFont | None) -> int:
        """The height of `row`'s item in an item `item_width` wide, cached separately.

        `QListView` asks every row for its size on each relayout (every streamed token), so
        this is the hot path: a hit is one dict lookup and no Qt call.
        """
        key = (row.node_id, hash(row.text), item_width)
        height = self._heights.get(key)
        if height is not None:
            self._heights.move_to_end(key)
            return height
        font = font if font is not None else self._font()
        doc = self.document(row, self.text_width(row.role, item_width), font)
        header_h = self._header_height(QFontMetrics(font))
        height = (
            2 * self.MARGIN_V
            + 2 * self.PADDING
            + header_h
            + self.HEADER_GAP
            + math.ceil(doc.size().height())
        )
        _remember(self._heights, self._latest_height, key, height, self.height_cache_limit)
        return height

    # --- geometry ----------------------------------------------------------------------

    def _font(self) -> QFont:
        parent = self.parent()
        return parent.font() if isinstance(parent, QWidget) else QApplication.font()

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
        key = (row.node_id, hash(row.text), width)
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
        text_width = self.text_width(row.role, option.rect.width())
        doc = self.document(row, text_width, font)
        ideal = math.ceil(doc.idealWidth()) if row.role == USER else None
        geometry = self._geometry(option.rect, row, font, ideal)
        palette: QPalette = option.palette
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        if row.role == USER:
            fill = _mix(base, palette.color(QPalette.ColorRole.Highlight), 0.22)
        else:
            fill = _mix(base, text, 0.06)
        dim = _mix(text, fill, 0.45)
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
                    _mix(palette.color(QPalette.ColorRole.Text), QColor(220, 60, 40), 0.7)
                )
            else:
                painter.setPen(dim)
            elided = QFontMetrics(font).elidedText(
                markers, Qt.TextElideMode.ElideRight, max(0, marker_rect.width())
            )
            painter.drawText(marker_rect, align, elided)
        if row.variants > 1:
            self._paint_switcher(painter, geometry, row, font, text, dim)

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

    def editorEvent(
        self,
        event: QEvent,
        model: QAbstractItemModel,
        option: QStyleOptionViewItem,
        index: ModelIndex,
    ) -> bool:
        """Clicks on the switcher arrows emit `variant_requested`; other events pass on."""
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
        direction = self.arrow_at(option.rect, row, event.position().toPoint())
        if direction == 0:
            return super().editorEvent(event, model, option, index)
        if kind == QEvent.Type.MouseButtonRelease:
            log.debug("switch node %s to variant %s", row.node_id, row.variant + direction)
            self.variant_requested.emit(row.node_id, row.variant + direction)
        return True


# --- the view ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _ActionSpec:
    name: str
    text: str
    tip: str
    keys: tuple[str, ...]


_ACTIONS: tuple[_ActionSpec, ...] = (
    _ActionSpec(
        "edit", "&Edit…", "Edit this message (the original is kept as a version)", ("Ctrl+E",)
    ),
    _ActionSpec("regenerate", "&Regenerate", "Write a new version of this reply", ("Ctrl+R",)),
    _ActionSpec(
        "rewind",
        "Re&wind here",
        "End the conversation at this message (later messages stay in the tree)",
        ("Ctrl+Backspace",),
    ),
    _ActionSpec(
        "fork",
        "&Fork from here",
        "Start a new conversation that shares everything up to this message",
        ("Ctrl+Shift+F",),
    ),
    _ActionSpec(
        "copy", "&Copy text", "Copy this message's text to the clipboard", ("Ctrl+Shift+C",)
    ),
    _ActionSpec(
        "delete", "&Delete branch", "Delete this message and everything after it", ("Delete",)
    ),
    _ActionSpec(
        "previous_variant", "&Previous version", "Show the previous version", ("Alt+Left",)
    ),
    _ActionSpec("next_variant", "&Next version", "Show the next version", ("Alt+Right",)),
)


class ChatView(QListView):
    """The conversation's messages, with per-message actions reported as signals.

    The view never changes a tree itself: it reports what the user asked for with the node
    id of the current message and the owner applies it and feeds new rows back. Keys (scoped
    to the view): Ctrl+E edit, Ctrl+R regenerate (assistant replies), Ctrl+Backspace rewind,
    Ctrl+Shift+F fork, Ctrl+Shift+C copy, Delete delete, Alt+Left / Alt+Right previous /
    next version. Use it from the GUI thread only.
    """

    variant_requested = Signal(int, int)  # node id, wanted variant index
    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    rewind_requested = Signal(int)
    fork_requested = Signal(int)
    copy_requested = Signal(int)
    delete_requested = Signal(int)

    BOTTOM_SLACK: ClassVar[int] = 4  # pixels from the end that still count as "at the bottom"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._chat_model = ChatModel(self)
        self._delegate = MessageDelegate(self)
        self.setModel(self._chat_model)
        self.setItemDelegate(self._delegate)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setUniformItemSizes(False)
        self.setWordWrap(True)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # A scroll bar that comes and goes changes the width, which re-lays out every message.
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)
        self.verticalScrollBar().setSingleStep(24)
        self.setMouseTracking(True)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.DefaultContextMenu)

        self._follow_tail = True
        self._at_bottom = True
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scroll_value)
        bar.rangeChanged.connect(self._on_scroll_range)

        self._delegate.variant_requested.connect(self.variant_requested)
        self._actions: dict[str, QAction] = {}
        for spec in _ACTIONS:
            action = QAction(spec.text, self)
            action.setObjectName(f"chat_{spec.name}_action")
            action.setShortcuts([QKeySequence(key) for key in spec.keys])
            action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            shortcut = spec.keys[0]
            action.setToolTip(f"{spec.tip} ({QKeySequence(shortcut).toString()})")
            action.setStatusTip(spec.tip)
            self.addAction(action)
            self._actions[spec.name] = action
        self.edit_action.triggered.connect(self._on_edit)
        self.regenerate_action.triggered.connect(self._on_regenerate)
        self.rewind_action.triggered.connect(self._on_rewind)
        self.fork_action.triggered.connect(self._on_fork)
        self.copy_action.triggered.connect(self._on_copy)
        self.delete_action.triggered.connect(self._on_delete)
        self.previous_variant_action.triggered.connect(self._on_previous_variant)
        self.next_variant_action.triggered.connect(self._on_next_variant)

        self.selectionModel().currentChanged.connect(self._on_current_changed)
        self._chat_model.modelReset.connect(self.update_actions)
        self._chat_model.modelReset.connect(self._on_model_reset)
        self._chat_model.rowsInserted.connect(self.update_actions)
        self._chat_model.rowsRemoved.connect(self.update_actions)
        self._chat_model.dataChanged.connect(self.update_actions)
        self.update_actions()

    # --- parts -------------------------------------------------------------------------

    @property
    def chat_model(self) -> ChatModel:
        """The view's model."""
        return self._chat_model

    @property
    def delegate(self) -> MessageDelegate:
        """The view's delegate."""
        return self._delegate

    def action(self, name: str) -> QAction:
        """One of: edit, regenerate, rewind, fork, copy, delete, previous_variant, next_variant."""
        return self._actions[name]

    @property
    def edit_action(self) -> QAction:
        return self._actions["edit"]

    @property
    def regenerate_action(self) -> QAction:
        return self._actions["regenerate"]

    @property
    def rewind_action(self) -> QAction:
        return self._actions["rewind"]

    @property
    def fork_action(self) -> QAction:
        return self._actions["fork"]

    @property
    def copy_action(self) -> QAction:
        return self._actions["copy"]

    @property
    def delete_action(self) -> QAction:
        return self._actions["delete"]

    @property
    def previous_variant_action(self) -> QAction:
        return self._actions["previous_variant"]

    @property
    def next_variant_action(self) -> QAction:
        return self._actions["next_variant"]

    # --- feeding -----------------------------------------------------------------------

    def set_rows(self, rows: Sequence[MessageRow]) -> None:
        """Show `rows` (see `ChatModel.set_rows`)."""
        self._chat_model.set_rows(rows)

    def update_text(self, node_id: int, text: str, status: str = STREAMING) -> bool:
        """Grow a streaming reply (see `ChatModel.update_text`)."""
        return self._chat_model.update_text(node_id, text, status)

    # --- the current message -----------------------------------------------------------

    def current_row(self) -> MessageRow | None:
        """The snapshot of the current message, or None."""
        index = self.currentIndex()
        if not index.isValid():
            return None
        return self._chat_model.row_at(index.row())

    def select_node(self, node_id: int) -> bool:
        """Make `node_id` the current, selected message. False when it is not shown."""
        row = self._chat_model.row_of(node_id)
        if row is None:
            return False
        self.setCurrentIndex(self._chat_model.index(row, 0))
        return True

    @Slot()
    def update_actions(self) -> None:
        """Enable the actions that make sense for the current message."""
        row = self.current_row()
        has = row is not None
        for name in ("edit", "rewind", "fork", "copy", "delete"):
            self._actions[name].setEnabled(has)
        self.regenerate_action.setEnabled(has and row.role == ASSISTANT)
        self.previous_variant_action.setEnabled(has and row.variant > 0)
        self.next_variant_action.setEnabled(has and row.variant + 1 < row.variants)

    @Slot(QModelIndex, QModelIndex)
    def _on_current_changed(self, _current: QModelIndex, _previous: QModelIndex) -> None:
        self.update_actions()

    def _emit_for_current(self, signal: Any, name: str) -> MessageRow | None:
        row = self.current_row()
        if row is None:
            return None
        log.debug("%s requested for node %s", name, row.node_id)
        signal.emit(row.node_id)
        return row

    @Slot()
    def _on_edit(self) -> None:
        self._emit_for_current(self.edit_requested, "edit")

    @Slot()
    def _on_regenerate(self) -> None:
        row = self.current_row()
        if row is not None and row.role == ASSISTANT:
            self._emit_for_current(self.regenerate_requested, "regenerate")

    @Slot()
    def _on_rewind(self) -> None:
        self._emit_for_current(self.rewind_requested, "rewind")

    @Slot()
    def _on_fork(self) -> None:
        self._emit_for_current(self.fork_requested, "fork")

    @Slot()
    def _on_copy(self) -> None:
        row = self.current_row()
        if row is None:
            return
        QGuiApplication.clipboard().setText(row.text)
        self._emit_for_current(self.copy_requested, "copy")

    @Slot()
    def _on_delete(self) -> None:
        self._emit_for_current(self.delete_requested, "delete")

    @Slot()
    def _on_previous_variant(self) -> None:
        self._step_variant(-1)

    @Slot()
    def _on_next_variant(self) -> None:
        self._step_variant(1)

    def _step_variant(self, step: int) -> None:
        row = self.current_row()
        if row is None:
            return
        wanted = row.variant + step
        if 0 <= wanted < row.variants:
            self.variant_requested.emit(row.node_id, wanted)

    # --- menus and keys ----------------------------------------------------------------

    def context_menu(self) -> QMenu:
        """The menu of actions for the current message (the caller shows and deletes it)."""
        self.update_actions()
        menu = QMenu(self)
        row = self.current_row()
        menu.addAction(self.copy_action)
        menu.addAction(self.edit_action)
        if row is not None and row.role == ASSISTANT:
            menu.addAction(self.regenerate_action)
        if row is not None and row.variants > 1:
            menu.addSeparator()
            menu.addAction(self.previous_variant_action)
            menu.addAction(self.next_variant_action)
        menu.addSeparator()
        menu.addAction(self.rewind_action)
        menu.addAction(self.fork_action)
        menu.addSeparator()
        menu.addAction(self.delete_action)
        menu.setToolTipsVisible(True)
        return menu

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:
        """Right click on a message: make it current and offer its actions."""
        index = self.indexAt(event.pos())
        if not index.isValid():
            event.ignore()
            return
        self.setCurrentIndex(index)
        menu = self.context_menu()
        menu.exec(event.globalPos())
        menu.deleteLater()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Run an action's key even when no shortcut fired (say, the window is not active)."""
        pressed = QKeySequence(event.keyCombination())
        for action in self._actions.values():
            if any(
                seq.matches(pressed) == QKeySequence.SequenceMatch.ExactMatch
                for seq in action.shortcuts()
            ):
                if action.isEnabled():
                    action.trigger()
                event.accept()
                return
        super().keyPressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        """A pointing hand over an enabled switcher arrow."""
        pos = event.position().toPoint()
        index = self.indexAt(pos)
        row = MessageDelegate.row_from_index(index)
        over = row is not None and self._delegate.arrow_at(self.visualRect(index), row, pos) != 0
        if over:
            self.viewport().setCursor(Qt.CursorShape.PointingHandCursor)
        else:
            self.viewport().unsetCursor()
        super().mouseMoveEvent(event)

    # --- scrolling ---------------------------------------------------------------------

    @property
    def follow_tail(self) -> bool:
        """Whether the view stays at the bottom while the last message grows (when the user
        was already at the bottom)."""
        return self._follow_tail

    @follow_tail.setter
    def follow_tail(self, enabled: bool) -> None:
        self._follow_tail = bool(enabled)

    def is_at_bottom(self) -> bool:
        """Whether the view shows the end of the conversation."""
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - self.BOTTOM_SLACK

    def scroll_to_node(
        self,
        node_id: int,
        hint: QAbstractItemView.ScrollHint = QAbstractItemView.ScrollHint.PositionAtTop,
    ) -> bool:
        """Scroll so that `node_id` shows (its top at the top by default)."""
        row = self._chat_model.row_of(node_id)
        if row is None:
            return False
        self.scrollTo(self._chat_model.index(row, 0), hint)
        return True

    @Slot()
    def scroll_to_end(self) -> None:
        """Show the end of the conversation and follow it again."""
        self.doItemsLayout()
        self.scrollToBottom()
        self._at_bottom = True

    def scrollTo(
        self,
        index: ModelIndex,
        hint: QAbstractItemView.ScrollHint = QAbstractItemView.ScrollHint.EnsureVisible,
    ) -> None:
        """As QListView, but a message taller than the view that is already partly visible
        does not jump to its top when clicked."""
        if hint == QAbstractItemView.ScrollHint.EnsureVisible and index.isValid():
            rect = self.visualRect(index)
            area = self.viewport().rect()
            if rect.height() > area.height() and rect.intersects(area):
                return
        super().scrollTo(index, hint)

    @Slot()
    def _on_model_reset(self) -> None:
        # Another conversation: open it at its end.
        self._at_bottom = True

    @Slot(int)
    def _on_scroll_value(self, _value: int) -> None:
        self._at_bottom = self.is_at_bottom()

    @Slot(int, int)
    def _on_scroll_range(self, _minimum: int, maximum: int) -> None:
        if self._follow_tail and self._at_bottom:
            self.verticalScrollBar().setValue(maximum)

    # --- other events ------------------------------------------------------------------

    def changeEvent(self, event: QEvent) -> None:
        """A new font changes every layout."""
        if event.type() == QEvent.Type.FontChange:
            self._delegate.clear_cache()
            self.scheduleDelayedItemsLayout()
        super().changeEvent(event)
