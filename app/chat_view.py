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
* Editing happens in place: the delegate creates a `MessageEditor` over the one bubble being
  edited (a persistent editor, so the only widget in the list) and the row grows to fit it.
  The model stays read-only; the view reports the new text with `edit_submitted`.
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
    QLabel,
    QLayout,
    QListView,
    QMenu,
    QPlainTextEdit,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
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


# --- the in-place editor -----------------------------------------------------------------


def _is_enter(event: QKeyEvent) -> bool:
    return event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)


class _EditBox(QPlainTextEdit):
    """The editor's text box, with the composer's keys: Enter submits, Shift+Enter is a new
    line, Esc cancels.

    It keeps every key it is sent: the chat view's own keys (Delete, Ctrl+Backspace,
    Alt+Left...) act on whole messages, so one that slipped through from the box would delete
    a branch or switch versions while the user is only editing text. `reserved` lists those
    keys; the box claims them before any shortcut sees them.
    """

    submit = Signal()
    cancel = Signal()
    resized = Signal()

    def __init__(self, parent: QWidget, reserved: Sequence[QKeySequence]) -> None:
        super().__init__(parent)
        self._reserved = tuple(reserved)
        self.setTabChangesFocus(True)  # as in the composer

    def _claims(self, event: QKeyEvent) -> bool:
        if _is_enter(event) or event.key() == Qt.Key.Key_Escape:
            return True  # never the window's Stop (Esc) or any other window shortcut
        pressed = QKeySequence(event.keyCombination())
        return any(
            seq.matches(pressed) == QKeySequence.SequenceMatch.ExactMatch for seq in self._reserved
        )

    def event(self, event: QEvent) -> bool:
        """Claim the reserved keys, Enter and Esc before shortcuts fire."""
        if (
            event.type() == QEvent.Type.ShortcutOverride
            and isinstance(event, QKeyEvent)
            and self._claims(event)
        ):
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Enter submits, Shift+Enter is a new line, Esc cancels; no key reaches the view."""
        if _is_enter(event) and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submit.emit()
        elif event.key() == Qt.Key.Key_Escape:
            self.cancel.emit()
        else:
            super().keyPressEvent(event)
        event.accept()

    def resizeEvent(self, event: Any) -> None:
        """A new width wraps the text anew, which may change the height it needs."""
        super().resizeEvent(event)
        self.resized.emit()

    def content_height(self) -> int:
        """Pixels the wrapped text needs at the current width, frame included."""
        doc = self.document()
        height = doc.documentMargin()  # the first block's rect has the top margin already
        block = doc.begin()
        while block.isValid():
            height += self.blockBoundingRect(block).height()  # lays the block out if needed
            block = block.next()
        frame = self.contentsMargins()
        return math.ceil(height) + frame.top() + frame.bottom()


class MessageEditor(QWidget):
    """The in-place editor of one message: a multi-line text box and a hint line below it.

    Created by `MessageDelegate.createEditor` for the one message being edited. It reports
    the user's decision (`submitted` with the raw text, or `cancelled`) and the height it
    would like (`height_wanted`, the text plus a spare line and the hint); it never writes to
    the model. The font is the view's, inherited through the viewport.
    """

    submitted = Signal(str)
    cancelled = Signal()
    height_wanted = Signal(int)

    HINT: ClassVar[str] = "Enter to submit · Shift+Enter new line · Esc to cancel"
    SPACING: ClassVar[int] = 4

    def __init__(
        self, parent: QWidget | None = None, *, reserved_keys: Sequence[QKeySequence] = ()
    ) -> None:
        super().__init__(parent)
        self.setObjectName("chat_message_editor")
        self._box = _EditBox(self, reserved_keys)
        self._hint = QLabel(self.HINT, self)
        self._hint.setObjectName("chat_edit_hint")
        self._hint.setForegroundRole(QPalette.ColorRole.PlaceholderText)  # dim on any palette
        layout = QVBoxLayout(self)
        layout.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(self.SPACING)
        layout.addWidget(self._box, 1)
        layout.addWidget(self._hint)
        self.setFocusProxy(self._box)
        self._filled = False
        self._wanted = 0
        self._box.submit.connect(self._on_submit)
        self._box.cancel.connect(self.cancelled)
        self._box.textChanged.connect(self._update_height)
        self._box.resized.connect(self._update_height)

    @property
    def text_edit(self) -> QPlainTextEdit:
        """The text box (to type into, or to inspect)."""
        return self._box

    @property
    def filled(self) -> bool:
        """Whether the editor has been given its text (later row updates leave it alone)."""
        return self._filled

    def text(self) -> str:
        """The text as the user has it now, unstripped."""
        return self._box.toPlainText()

    def set_text(self, text: str) -> None:
        """Replace the text (a fresh undo history) and put the cursor at its end."""
        self._box.setPlainText(text)
        self._box.moveCursor(QTextCursor.MoveOperation.End)
        self._filled = True

    def wanted_height(self) -> int:
        """The text's height plus a spare line, then the hint: what the editor would like."""
        box = self._box.content_height() + self._box.fontMetrics().lineSpacing()
        return box + self.SPACING + self._hint.sizeHint().height()

    def changeEvent(self, event: QEvent) -> None:
        """Another font (the view's changed) means other line heights."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._update_height()

    @Slot()
    def _update_height(self) -> None:
        wanted = self.wanted_height()
        if wanted != self._wanted:
            self._wanted = wanted
            self.height_wanted.emit(wanted)

    @Slot()
    def _on_submit(self) -> None:
        self.submitted.emit(self.text())


@dataclass
class _Editing:
    """The delegate's note of the message being edited (at most one)."""

    node_id: int
    index: QPersistentModelIndex
    height: int  # what the editor wants, before the cap


# --- the delegate ------------------------------------------------------------------------


def _mix(a: QColor, b: QColor, amount: float) -> QColor:
    """`a` moved `amount` (0..1) of the way towards `b`; works the same on light and dark."""
    return QColor.fromRgbF(
        a.redF() + (b.redF() - a.redF()) * amount,
        a.greenF() + (b.greenF() - a.greenF()) * amount,
        a.blueF() + (b.blueF() - a.blueF()) * amount,
        1.0,
    )


# Translucent grey reads on both light and dark bubbles, so a theme switch need not touch it
# (the link colour does go into cached documents: see `ChatView.changeEvent`).
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


def _colour_links(doc: QTextDocument, colour: QColor) -> None:
    """Paint links in `colour`: the Markdown importer bakes in the application palette's
    link colour of the moment, which is unreadable once the theme turns dark (#0000ff)."""
    cursor = QTextCursor(doc)
    link = QTextCharFormat()
    link.setForeground(colour)
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.isValid() and fragment.charFormat().isAnchor():
                cursor.setPosition(fragment.position())
                cursor.setPosition(
                    fragment.position() + fragment.length(), QTextCursor.MoveMode.KeepAnchor
                )
                cursor.mergeCharFormat(link)
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
    """Paints a message as a Markdown bubble with a role header and a version switcher.

    It also makes the in-place `MessageEditor` for the one message being edited: the row of
    that message grows to the editor's wanted height (capped at `EDITOR_SHARE` of the view),
    its bubble takes the full width and its text is left to the editor, which sits over it.
    """

    variant_requested = Signal(int, int)  # node id, wanted variant index

    MARGIN_H: ClassVar[int] = 12  # outside the bubble, left and right
    MARGIN_V: ClassVar[int] = 5  # outside the bubble, above and below
    PADDING: ClassVar[int] = 10  # inside the bubble
    HEADER_GAP: ClassVar[int] = 4  # between the header line and the text
    RADIUS: ClassVar[float] = 9.0
    USER_WIDTH: ClassVar[float] = 0.8  # user bubbles are at most this share of the width
    MIN_USER_WIDTH: ClassVar[int] = 260
    ROLE_LABELS: ClassVar[dict[str, str]] = {USER: "You", ASSISTANT: "Assistant"}
    EDITOR_SHARE: ClassVar[float] = 0.6  # an editor is at most this share of the view's height
    EDITOR_MIN_CAP: ClassVar[int] = 120  # ...but may always be this tall (a short view)

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
        self._edit: _Editing | None = None

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
        _colour_links(doc, self._palette().color(QPalette.ColorRole.Link))
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
        if self._edit is not None and row.node_id == self._edit.node_id:
            return QSize(width, self._editing_height(option, self._edit.height))
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
        editing = self._edit is not None and row.node_id == self._edit.node_id
        text_width = self.text_width(row.role, option.rect.width())
        doc = None if editing else self.document(row, text_width, font)
        ideal = math.ceil(doc.idealWidth()) if doc is not None and row.role == USER else None
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
        if doc is None:  # being edited: the editor shows the text
            painter.restore()
            return

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

    # --- editing in place --------------------------------------------------------------

    @property
    def editing_node(self) -> int | None:
        """The node whose editor this delegate made and has not destroyed yet, or None."""
        return None if self._edit is None else self._edit.node_id

    def _editing_height(self, option: QStyleOptionViewItem, wanted: int) -> int:
        """The edited row's height: the bubble's frame around the editor's (capped) height."""
        widget = option.widget
        view_height = widget.viewport().height() if isinstance(widget, QAbstractItemView) else 0
        cap = max(self.EDITOR_MIN_CAP, int(view_height * self.EDITOR_SHARE))
        header_h = self._header_height(QFontMetrics(QFont(option.font)))
        return 2 * self.MARGIN_V + 2 * self.PADDING + header_h + self.HEADER_GAP + min(wanted, cap)

    def createEditor(
        self, parent: QWidget, option: QStyleOptionViewItem, index: ModelIndex
    ) -> QWidget:
        """A `MessageEditor` that keeps the view's own keys (they act on whole messages)."""
        row = self._row(index)
        if row is None:
            return super().createEditor(parent, option, index)
        actions = option.widget.actions() if option.widget is not None else []
        keys = [seq for action in actions for seq in action.shortcuts()]
        editor = MessageEditor(parent, reserved_keys=keys)
        self._edit = _Editing(row.node_id, QPersistentModelIndex(index), editor.wanted_height())
        editor.height_wanted.connect(self._on_editor_height)
        return editor

    def setEditorData(self, editor: QWidget, index: ModelIndex) -> None:
        """Prefill a fresh editor with the message's text, and only a fresh one: the view
        calls this again whenever the row changes (a new version count, a checkpoint), which
        must not throw away what the user typed."""
        if not isinstance(editor, MessageEditor):
            super().setEditorData(editor, index)
            return
        row = self._row(index)
        if row is not None and not editor.filled:
            editor.set_text(row.text)

    def setModelData(self, editor: QWidget, model: QAbstractItemModel, index: ModelIndex) -> None:
        """Nothing: the model is read-only; the view reports the edit and its owner applies
        it to the tree."""

    def updateEditorGeometry(
        self, editor: QWidget, option: QStyleOptionViewItem, index: ModelIndex
    ) -> None:
        """Place the editor over the text area of a full-width bubble (the header stays)."""
        row = self._row(index)
        if row is None:
            super().updateEditorGeometry(editor, option, index)
            return
        geometry = self._geometry(option.rect, row, QFont(option.font))
        bubble = geometry.bubble
        bottom_right = QPoint(bubble.right() - self.PADDING, bubble.bottom() - self.PADDING)
        editor.setGeometry(QRect(geometry.text_origin, bottom_right))

    def destroyEditor(self, editor: QWidget, index: ModelIndex) -> None:
        """Forget the edit and let the row shrink back to its bubble."""
        if isinstance(editor, MessageEditor):
            editor.height_wanted.disconnect(self._on_editor_height)
            self._edit = None
            if index.isValid():
                self.sizeHintChanged.emit(QModelIndex(index))
        super().destroyEditor(editor, index)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Leave a `MessageEditor` alone: by default a delegate commits and closes its editor
        when focus leaves it, which would throw away a long edit on a stray click."""
        if isinstance(watched, MessageEditor):
            return False
        return super().eventFilter(watched, event)

    @Slot(int)
    def _on_editor_height(self, height: int) -> None:
        edit = self._edit
        if edit is None or edit.height == height:
            return
        edit.height = height
        if edit.index.isValid():
            self.sizeHintChanged.emit(QModelIndex(edit.index))


# --- the view ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _ActionSpec:
    name: str
    text: str
    tip: str
    keys: tuple[str, ...]


_ACTIONS: tuple[_ActionSpec, ...] = (
    _ActionSpec(
        "edit",
        "&Edit",
        "Edit this message in place (the original is kept as a version)",
        ("Ctrl+E", "F2"),
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
    to the view): Ctrl+E or F2 edit, Ctrl+R regenerate (assistant replies), Ctrl+Backspace
    rewind, Ctrl+Shift+F fork, Ctrl+Shift+C copy, Delete delete, Alt+Left / Alt+Right
    previous / next version. Use it from the GUI thread only.

    Editing is in place (the edit action, or a double click on a user message): an editor
    opens over the bubble and stays open, focus or not, until Enter or Esc, or until its
    message leaves the view. Every `edit_started` is followed by exactly one
    `edit_submitted` (the new text, stripped, when it is not blank and differs) or
    `edit_cancelled` (Esc, an unchanged or blank text, another edit started, the message
    gone from the rows).
    """

    variant_requested = Signal(int, int)  # node id, wanted variant index
    edit_started = Signal(int)  # node id; the owner may warm the engine up meanwhile
    edit_submitted = Signal(int, str)  # node id, the new text (stripped)
    edit_cancelled = Signal(int)  # node id
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
        self._editing: int | None = None  # the node whose editor is open
        self._lost_edit: int | None = None  # closed by a model change, cancelled once it ends
        self._kept_edit: tuple[str, bool] | None = None  # (text, focused) across a reset
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
        self._chat_model.modelAboutToBeReset.connect(self._on_model_about_to_reset)
        self._chat_model.modelReset.connect(self._on_model_reset)
        self._chat_model.rowsRemoved.connect(self._on_rows_removed)
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
        row = self.current_row()
        if row is not None:
            self.start_edit(row.node_id)

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

    # --- editing in place --------------------------------------------------------------

    @property
    def editing_node(self) -> int | None:
        """The node whose editor is open, or None."""
        return self._editing

    def editor(self) -> MessageEditor | None:
        """The open editor (the only widget among the messages), or None."""
        index = self._index_of(self._editing)
        widget = self.indexWidget(index) if index is not None else None
        return widget if isinstance(widget, MessageEditor) else None

    def start_edit(self, node_id: int) -> bool:
        """Open the editor on `node_id`, prefilled with its text; another open edit is
        cancelled first (one at a time). False when the node is not shown."""
        index = self._index_of(node_id)
        if index is None:
            return False
        if node_id == self._editing:
            editor = self.editor()
            if editor is not None:
                editor.setFocus()
            return True
        self.cancel_edit()
        self.setCurrentIndex(index)
        self._open_editor(node_id, None, focus=True)
        self.scrollTo(index)
        log.debug("editing node %s", node_id)
        self.edit_started.emit(node_id)
        return True

    @Slot()
    def cancel_edit(self) -> None:
        """Close the open editor, if any, and report the edit cancelled."""
        node = self._close_editor()
        if node is not None:
            log.debug("edit of node %s cancelled", node)
            self.edit_cancelled.emit(node)

    def _index_of(self, node_id: int | None) -> QModelIndex | None:
        row = None if node_id is None else self._chat_model.row_of(node_id)
        return None if row is None else self._chat_model.index(row, 0)

    def _open_editor(self, node_id: int, text: str | None, *, focus: bool) -> None:
        index = self._index_of(node_id)
        if index is None:
            return
        self._editing = node_id
        self.openPersistentEditor(index)
        editor = self.editor()
        if editor is None:
            self._editing = None
            return
        if text is not None:
            editor.set_text(text)
        editor.submitted.connect(self._on_editor_submitted)
        editor.cancelled.connect(self.cancel_edit)
        if focus:
            editor.setFocus()

    def _close_editor(self) -> int | None:
        """Close the open editor without a signal; returns its node id (None if none)."""
        node, self._editing = self._editing, None
        index = self._index_of(node)
        if index is not None:
            self.closePersistentEditor(index)
        return node

    @Slot(str)
    def _on_editor_submitted(self, text: str) -> None:
        node = self._editing
        index = self._index_of(node)
        if node is None or index is None:
            return
        original = self._chat_model.row_at(index.row()).text
        new = text.strip()
        if not new or new == original.strip():
            self.cancel_edit()
            return
        self._close_editor()  # first: the owner's new rows should find no editor open
        log.debug("edit of node %s submitted", node)
        self.edit_submitted.emit(node, new)

    def rowsAboutToBeRemoved(self, parent: ModelIndex, start: int, end: int) -> None:
        """The edited message going away closes its editor (reported once the rows are gone;
        Qt would otherwise drop the editor behind the view's back)."""
        index = self._index_of(self._editing)
        if index is not None and not parent.isValid() and start <= index.row() <= end:
            self._lost_edit = self._close_editor()
        super().rowsAboutToBeRemoved(parent, start, end)

    @Slot()
    def _on_rows_removed(self) -> None:
        node, self._lost_edit = self._lost_edit, None
        if node is not None:
            self.edit_cancelled.emit(node)

    @Slot()
    def _on_model_about_to_reset(self) -> None:
        # A reset drops every editor: keep the text, to reopen it if the message stays.
        editor = self.editor()
        if editor is not None:
            self._kept_edit = (editor.text(), editor.text_edit.hasFocus())
        self._lost_edit = self._close_editor()

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

    def mouseDoubleClickEvent(self, event: QMouseEvent) -> None:
        """A double click on a user message (not on its version arrows) edits it."""
        pos = event.position().toPoint()
        index = self.indexAt(pos)
        row = MessageDelegate.row_from_index(index)
        if event.button() == Qt.MouseButton.LeftButton and row is not None and row.role == USER:
            arrows = self._delegate.switcher_rects(self.visualRect(index), row)
            if not any(rect.contains(pos) for rect in arrows):
                self.start_edit(row.node_id)
                event.accept()
                return
        super().mouseDoubleClickEvent(event)

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
        node, self._lost_edit = self._lost_edit, None
        kept, self._kept_edit = self._kept_edit, None
        if node is None:
            return
        if self._chat_model.row_of(node) is not None and kept is not None:
            text, focused = kept
            self._open_editor(node, text, focus=focused)  # the same message: keep editing
        else:
            self.edit_cancelled.emit(node)

    @Slot(int)
    def _on_scroll_value(self, _value: int) -> None:
        self._at_bottom = self.is_at_bottom()

    @Slot(int, int)
    def _on_scroll_range(self, _minimum: int, maximum: int) -> None:
        if self._follow_tail and self._at_bottom:
            self.verticalScrollBar().setValue(maximum)

    # --- other events ------------------------------------------------------------------

    def changeEvent(self, event: QEvent) -> None:
        """A new font changes every layout; a new palette (light/dark switch) changes the
        colours baked into the cached documents (links)."""
        if event.type() == QEvent.Type.FontChange:
            self._delegate.clear_cache()
            self.scheduleDelayedItemsLayout()
        elif event.type() == QEvent.Type.PaletteChange:
            self._delegate.clear_documents()
            self.viewport().update()
        super().changeEvent(event)
